// Command scripted-harness is the scripted coding-agent harness (package
// participants/scripted/harness): it talks to a chat-completions model, runs
// the tool commands it asks for and keeps its session in --data.
package main
