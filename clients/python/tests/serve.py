"""Serves a hello app behind rld's WSGI or ASGI middleware through a real
server, on 127.0.0.1 and ::1, for the tests (Python's and python_test.go's).

    /usr/bin/python3 serve.py {wsgiref|gunicorn|uvicorn} RLD_SOCKET [HEADER,...]

It prints one line, "listening 127.0.0.1:PORT [::1]:PORT", once both
listen, and serves until it is killed. The servers run as their users run
them: gunicorn (gthread worker, one process) and uvicorn (h11) from Debian's
packages, wsgiref from the standard library; uvicorn without proxy headers,
so that scope["client"] is the peer. The app answers 200 "hello" to
everything the middleware lets through.
"""

import os
import socket
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import rld  # noqa: E402


def hello_wsgi(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain"), ("X-App", "hello")])
    return [b"hello\n"]


async def hello_asgi(scope, receive, send):
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"x-app", b"hello")]})
    await send({"type": "http.response.body", "body": b"hello\n"})


def listeners():
    """Returns two listening sockets: 127.0.0.1 and ::1, on ports of the kernel's choice."""
    out = []
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind((host, 0))
        s.listen(128)
        out.append(s)
    return out


def ports(socks):
    v4, v6 = (s.getsockname()[1] for s in socks)
    return f"listening 127.0.0.1:{v4} [::1]:{v6}"


def announce(socks):
    print(ports(socks), flush=True)


def serve_wsgiref(app):
    import socketserver
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args):
            pass

    class Server(socketserver.ThreadingMixIn, WSGIServer):
        daemon_threads = True

    class Server6(Server):
        address_family = socket.AF_INET6

    servers = [Server(("127.0.0.1", 0), Quiet), Server6(("::1", 0), Quiet)]
    for s in servers:
        s.set_app(app)
    announce([s.socket for s in servers])
    threading.Thread(target=servers[1].serve_forever, daemon=True).start()
    servers[0].serve_forever()


def serve_gunicorn(app):
    from gunicorn.app.base import BaseApplication

    socks = listeners()
    line = ports(socks)  # gunicorn closes these sockets once it has its own copies

    class App(BaseApplication):
        def load_config(self):
            # The sockets are ours: gunicorn takes them as inherited fds.
            self.cfg.set("bind", [f"fd://{s.fileno()}" for s in socks])
            self.cfg.set("workers", 1)
            self.cfg.set("threads", 4)
            self.cfg.set("worker_class", "gthread")
            self.cfg.set("loglevel", "warning")
            self.cfg.set("graceful_timeout", 2)
            self.cfg.set("limit_request_line", 8190)  # gunicorn's largest (default 4094)
            self.cfg.set("when_ready", lambda server: print(line, flush=True))

        def load(self):
            return app

    App().run()


def serve_uvicorn(app):
    import uvicorn

    socks = listeners()
    config = uvicorn.Config(app, proxy_headers=False, log_level="warning", access_log=False, lifespan="off",
                            http="h11")
    server = uvicorn.Server(config)
    announce(socks)
    server.run(sockets=socks)


def main():
    kind, sock = sys.argv[1], sys.argv[2]
    headers = sys.argv[3].split(",") if len(sys.argv) > 3 and sys.argv[3] else rld.DEFAULT_HEADERS
    if kind == "uvicorn":
        serve_uvicorn(rld.ASGIMiddleware(hello_asgi, rld.AsyncClient(sock, timeout=5), headers=headers))
        return
    app = rld.WSGIMiddleware(hello_wsgi, rld.Client(sock, timeout=5), headers=headers)
    if kind == "wsgiref":
        serve_wsgiref(app)
    elif kind == "gunicorn":
        serve_gunicorn(app)
    else:
        sys.exit(f"serve.py: unknown server {kind!r}: wsgiref, gunicorn or uvicorn")


if __name__ == "__main__":
    main()
