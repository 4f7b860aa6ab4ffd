# A worker's init container: waits until the master's name (argv[1]) resolves, at most argv[2] seconds. Run as
# `python3 -c TEXT NAME LIMIT` (render.WAIT_FOR_MASTER: this file less its full-line comments): a Python every
# training image has, and no shell, so the job name is an argument, never code.
import socket, sys, time

name, limit = sys.argv[1], int(sys.argv[2])
deadline, said = time.monotonic() + limit, False
while True:
    try:
        socket.getaddrinfo(name, None)
        break
    except OSError:
        if not said:
            print("hpctrain: waiting for the master pod", name, "to have a name (at most", limit, "s)", flush=True)
            said = True
        if time.monotonic() > deadline:
            print(
                "hpctrain: gave up after",
                limit,
                "s waiting for the master pod",
                name,
                "to have a name:",
                "it never started (see hpctrain status) or its Service is missing",
                flush=True,
            )
            sys.exit(1)
        time.sleep(2)
