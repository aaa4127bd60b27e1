"""The calls a training loop makes to a Stillpoint bridge, standard library only.

Usage as a script (what the Go test runs):
    python3 controller.py BRIDGE_URL TOKEN_FILE checkpoint|restore|release|cycle [args]

Each command prints the bridge's JSON answer on one line and exits 0 when the
operation succeeded, 1 when the fleet failed it, 2 on an API error.
"""

import json
import sys
import urllib.error
import urllib.request


class BridgeError(Exception):
    """The bridge refused the request: HTTP status, code and detail."""

    def __init__(self, status, code, detail):
        super().__init__(f"{code} (HTTP {status}): {detail}")
        self.status, self.code, self.detail = status, code, detail


class Bridge:
    """A client of one run's bridge."""

    def __init__(self, url, token, timeout=600):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def _call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", "Bearer " + self.token)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as e:
            err = json.load(e).get("error", {})
            raise BridgeError(e.code, err.get("code", "http_error"), err.get("detail", "")) from None

    def checkpoint(self, checkpoint_id=None, episodes=None, stop=False, timeout_ms=0):
        """Take a checkpoint; the answer's "status" is "committed" or "failed"."""
        body = {"stop": stop}
        if checkpoint_id:
            body["checkpoint_id"] = checkpoint_id
        if episodes:
            body["episodes"] = list(episodes)
        if timeout_ms:
            body["timeout_ms"] = timeout_ms
        return self._call("POST", "/v1/checkpoints", body)

    def restore(self, source=None):
        """Restore LATEST (or source) into the fresh fleet; "completed" or "failed"."""
        body = {"source_checkpoint_id": source} if source else {}
        return self._call("POST", "/v1/restore", body)

    def release(self, keep=None, keep_latest=0):
        """Delete what no kept checkpoint names; no arguments is the final release."""
        body = {}
        if keep:
            body["keep"] = list(keep)
        if keep_latest:
            body["keep_latest"] = keep_latest
        return self._call("POST", "/v1/release", body)

    def status(self):
        return self._call("GET", "/v1/status")


def main(argv):
    url, token_file, command, args = argv[1], argv[2], argv[3], argv[4:]
    with open(token_file) as f:
        bridge = Bridge(url, f.read().strip())
    try:
        if command == "checkpoint":
            res = bridge.checkpoint(checkpoint_id=args[0] if args else None)
            ok = res["status"] == "committed"
        elif command == "restore":
            res = bridge.restore(args[0] if args else None)
            ok = res["status"] == "completed"
        elif command == "release":
            res = bridge.release(keep=args)
            ok = res["status"] == "completed"
        elif command == "cycle":
            # A training loop's life: two checkpoints, keep the newest.
            first = bridge.checkpoint()
            second = bridge.checkpoint()
            rel = bridge.release(keep_latest=1)
            res = {"first": first, "second": second, "release": rel}
            ok = first["status"] == second["status"] == "committed" and rel["status"] == "completed"
        else:
            print("unknown command " + command, file=sys.stderr)
            return 2
    except BridgeError as e:
        print(json.dumps({"error": {"status": e.status, "code": e.code, "detail": e.detail}}))
        return 2
    print(json.dumps(res))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
