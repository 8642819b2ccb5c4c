"""A Python MCP host in miniature, for reaper's spawn-site tests: it starts its stdio server
from a named function, through subprocess.Popen on its main thread or through
asyncio.create_subprocess_exec on an event-loop thread, and holds the server's pipes until
released.

    mcp_host.py popen|asyncio|forked|early TRIGGER RELEASE

`forked`: a forked copy of the host (no exec: a prefork worker's, a double fork's) starts a
server (`sleep`, its output discarded) and closes its end of the server's stdin: the server
is deaf, on its own (it shares no channel with the worker).

It runs `true` first (its fork tells the test the interpreter was looked at), waits for
TRIGGER, starts the server, and ends it once RELEASE exists. `early`: it starts the server
at once, its first fork (as a gateway that spawns its servers as it starts), and ends it
once RELEASE exists.
"""
import asyncio
import os
import subprocess
import sys
import threading
import time


def wait_for(path):
    while not os.path.exists(path):
        time.sleep(0.01)


def start_stdio_server(command=("cat",), stdout=subprocess.PIPE, stderr=None):
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=stdout, stderr=stderr)


async def start_stdio_server_async():
    return await asyncio.create_subprocess_exec(
        "cat", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )


def event_loop(release):
    async def serve():
        server = await start_stdio_server_async()
        await asyncio.get_running_loop().run_in_executor(None, wait_for, release)
        server.kill()
        await server.wait()

    asyncio.run(serve())


def main():
    mode, trigger, release = sys.argv[1:4]
    if mode == "early":
        first = start_stdio_server()
        wait_for(release)
        first.kill()
        first.wait()
        return
    subprocess.run(["true"], check=True)
    wait_for(trigger)
    if mode == "popen":
        server = start_stdio_server()
        wait_for(release)
        server.kill()
        server.wait()
    elif mode == "forked":
        worker = os.fork()
        if worker == 0:
            quiet = subprocess.DEVNULL
            worker_server = start_stdio_server(("sleep", "600"), stdout=quiet, stderr=quiet)
            worker_server.stdin.close()
            wait_for(release)
            worker_server.kill()
            worker_server.wait()
            os._exit(0)
        os.waitpid(worker, 0)
    else:
        loop = threading.Thread(target=event_loop, args=(release,), name="event-loop")
        loop.start()
        loop.join()


main()
