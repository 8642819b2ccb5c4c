"""A stdio MCP server for the Hermes gateway tests, written with the mcp SDK's FastMCP.

`tiny_mcp_server.py NAME [--helper] [--hang]`: serves one `echo` tool over stdin/stdout. With
`--helper` it first starts a helper in a session of its own that reads a pipe from the server
until EOF and then waits (a background worker its server never tears down): when the server
exits, the helper lingers, holding the pipe. With `--hang` it is stuck before it serves: it
reads its requests and answers none (its gateway's connect timeout runs out), until EOF.
"""
import subprocess
import sys

from mcp.server.fastmcp import FastMCP

name = sys.argv[1] if len(sys.argv) > 1 else "tiny"
if "--helper" in sys.argv:
    subprocess.Popen(
        [sys.executable, "-c", "import sys, time; sys.stdin.read(); time.sleep(3600)"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

if "--hang" in sys.argv:
    for _request in sys.stdin:
        pass
    sys.exit(0)

mcp = FastMCP(name)


@mcp.tool()
def echo(text: str) -> str:
    """Returns its text."""
    return text


mcp.run()
