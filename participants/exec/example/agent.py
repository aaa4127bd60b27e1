#!/usr/bin/env python3
"""A small coding agent for Stillpoint's exec adapter (docs/HARNESSES.md).

It talks to an OpenAI-compatible chat-completions server, offers the model
one tool, bash, runs the calls the model makes in the working directory, and
keeps its session in one file, session.json in the session folder, written
after every step (a crash loses at most the step in flight). Python 3
standard library only.

  agent.py run --session DIR --workdir DIR --prompt=PROMPT
      a new session of PROMPT
  agent.py continue --session DIR --workdir DIR
      the saved session, with no new user turn: a tool call the crash
      interrupted runs again, then the loop goes on
  agent.py check --session DIR --prompt=PROMPT
      exit 0 if the saved session can be continued (it starts with PROMPT
      and holds a model response), 1 if not; the last line says why

The environment gives the model server: STILLPOINT_MODEL_URL (its base URL,
without /v1), STILLPOINT_TASK and STILLPOINT_EPISODE (sent with every call
as the X-Stillpoint-Task and X-Stillpoint-Episode headers), STILLPOINT_MODEL
(the model's name, default "default"). The answer, the model's last text,
goes to answer.txt in the session folder and to stdout.
"""

import argparse
import datetime
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

SESSION = "session.json"
ANSWER = "answer.txt"
MAX_TURNS = 64
CALL_TRIES = 4
# How long the agent waits, after a tool was killed by a signal, for a
# signal of its own before it keeps the tool's result: a stop signals the
# whole process tree at about the same time.
INTERRUPT_GRACE = 1.0

TOOLS = [{
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command in the working directory; returns its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "the command, run with /bin/sh -c"}},
            "required": ["command"],
        },
    },
}]


class Interrupted(Exception):
    """The agent was told to stop (SIGINT or SIGTERM)."""


def on_signal(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


def write_atomic(path, data):
    """Write data to path durably: a temporary file, fsync, rename, fsync of the folder."""
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def load(folder):
    with open(os.path.join(folder, SESSION), encoding="utf-8") as f:
        s = json.load(f)
    if not isinstance(s, dict) or not isinstance(s.get("messages"), list) or not s["messages"]:
        raise ValueError("no messages")
    return s


def save(folder, s):
    write_atomic(os.path.join(folder, SESSION), json.dumps(s, ensure_ascii=False, indent=1))


def pending_calls(messages):
    """The tool calls of the last assistant message that have no result yet."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m["role"] == "assistant":
            done = {r.get("tool_call_id") for r in messages[i + 1:] if r["role"] == "tool"}
            return [c for c in (m.get("tool_calls") or []) if c["id"] not in done]
    return []


def run_tool(call, workdir):
    """Run one bash call; its output (and exit status when not 0) is the result."""
    fn = call.get("function", {})
    try:
        command = json.loads(fn.get("arguments") or "{}")["command"]
    except (ValueError, KeyError, TypeError):
        return "error: unknown tool %r or bad arguments" % fn.get("name")
    if fn.get("name") != "bash" or not isinstance(command, str):
        return "error: unknown tool %r or bad arguments" % fn.get("name")
    # Its own process group, so that a stop of the agent finds it whole.
    p = subprocess.Popen(["/bin/sh", "-c", command], cwd=workdir, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = p.communicate()
    except BaseException:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.wait()
        raise
    if p.returncode < 0 or p.returncode > 128:
        # Killed by a signal: if the agent is being stopped too, the call
        # did not complete and stays pending (Interrupted is raised here).
        time.sleep(INTERRUPT_GRACE)
    text = out.decode("utf-8", "replace")
    if p.returncode != 0:
        text += "\nexit status %d" % p.returncode
    return text


def call_model(messages, saved_at):
    base = os.environ["STILLPOINT_MODEL_URL"].rstrip("/")
    body = json.dumps({"model": os.environ.get("STILLPOINT_MODEL", "default"), "messages": messages,
                       "tools": TOOLS}).encode()
    headers = {"Content-Type": "application/json",
               "X-Stillpoint-Task": os.environ.get("STILLPOINT_TASK", ""),
               "X-Stillpoint-Episode": os.environ.get("STILLPOINT_EPISODE", "")}
    if saved_at:
        # When this process saved the previous reply: the scripted model
        # server's ledger tells a repeated call by it.
        headers["X-Stillpoint-Saved"] = saved_at
    for attempt in range(1, CALL_TRIES + 1):
        req = urllib.request.Request(base + "/v1/chat/completions", data=body, headers=headers, method="POST")
        try:
            # No timeout: a checkpoint may hold the reply for as long as it takes.
            with urllib.request.urlopen(req) as resp:
                reply = json.load(resp)
            break
        except urllib.error.HTTPError as e:
            raise SystemExit("agent: the model answered %d: %s" % (e.code, e.read(4096).decode("utf-8", "replace")))
        except (urllib.error.URLError, http.client.RemoteDisconnected, ConnectionError) as e:
            # No answer began (refused, reset, closed before the reply):
            # the server read no request, so it is sent again.
            if attempt == CALL_TRIES:
                raise SystemExit("agent: model call (try %d of %d): %s" % (attempt, CALL_TRIES, e))
            print("agent: model call failed on its connection (try %d of %d), sending it again: %s"
                  % (attempt, CALL_TRIES, e), file=sys.stderr)
            time.sleep(0.2 * attempt)
    m = reply["choices"][0]["message"]
    msg = {"role": "assistant", "content": m.get("content") or ""}
    if m.get("tool_calls"):
        msg["tool_calls"] = m["tool_calls"]
    return msg


def loop(folder, workdir, s):
    saved_at = None
    for _ in range(MAX_TURNS):
        msgs = s["messages"]
        if msgs[-1]["role"] in ("assistant", "tool"):
            calls = pending_calls(msgs)
            if calls:
                for c in calls:
                    out = run_tool(c, workdir)
                    msgs.append({"role": "tool", "tool_call_id": c["id"], "content": out})
                    save(folder, s)
                continue
            if msgs[-1]["role"] == "assistant":
                answer = msgs[-1].get("content") or ""
                write_atomic(os.path.join(folder, ANSWER), answer + "\n")
                print(answer)
                return 0
        reply = call_model(msgs, saved_at)
        msgs.append(reply)
        save(folder, s)
        saved_at = datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")
    print("agent: no answer after %d model calls" % MAX_TURNS, file=sys.stderr)
    return 1


def check(folder, prompt):
    try:
        s = load(folder)
    except FileNotFoundError:
        return 1, "no saved session"
    except (OSError, ValueError) as e:
        return 1, "the saved session does not read: %s" % e
    first = s["messages"][0]
    if first.get("role") != "user" or first.get("content") != prompt:
        return 1, "the saved session does not start with the task's prompt"
    n = sum(1 for m in s["messages"] if m.get("role") == "assistant")
    if n == 0:
        return 1, "the saved session holds no model response"
    return 0, "the saved session holds %d messages, %d of them model responses" % (len(s["messages"]), n)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["run", "continue", "check"])
    ap.add_argument("--session", required=True, help="the session folder")
    ap.add_argument("--workdir", help="where tools run (run, continue)")
    ap.add_argument("--prompt", help="the task (run, check)")
    a = ap.parse_args()
    if a.mode == "check":
        if a.prompt is None:
            ap.error("check needs --prompt")
        code, why = check(a.session, a.prompt)
        print(why)
        return code
    if a.workdir is None:
        ap.error("%s needs --workdir" % a.mode)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    os.makedirs(a.session, exist_ok=True)
    if a.mode == "run":
        if a.prompt is None:
            ap.error("run needs --prompt")
        s = {"messages": [{"role": "user", "content": a.prompt}]}
        save(a.session, s)
    else:
        try:
            s = load(a.session)
        except (OSError, ValueError) as e:
            print("agent: continue: the saved session does not read: %s" % e, file=sys.stderr)
            return 3
    try:
        return loop(a.session, a.workdir, s)
    except Interrupted as e:
        print("agent: stopped by %s; the session is saved up to its last step" % e, file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
