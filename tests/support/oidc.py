"""A tiny OpenID Connect token endpoint for the OAUTHBEARER tests: client credentials in, an RS256
JWT out (`sub` = the client id), its public key at /jwks for the broker's validator. Only on
127.0.0.1, only for the clients it was given."""
from __future__ import annotations

import base64
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from joserfc import jwt
from joserfc.jwk import RSAKey


class TokenEndpoint:
    def __init__(self, clients: dict[str, str], lifetime_s: int = 3600) -> None:
        self.clients = clients
        self.key = RSAKey.generate_key(2048, parameters={"kid": "txstream-test", "use": "sig", "alg": "RS256"})
        self.issued = 0
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args) -> None:
                pass

            def _reply(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/jwks":
                    self._reply(200, {"keys": [endpoint.key.as_dict(private=False)]})
                else:
                    self._reply(404, {})

            def do_POST(self) -> None:
                form = urllib.parse.parse_qs(self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode())
                client_id, secret = form.get("client_id", [""])[0], form.get("client_secret", [""])[0]
                auth = self.headers.get("Authorization", "")
                if auth.startswith("Basic "):
                    client_id, _, secret = base64.b64decode(auth[6:]).decode().partition(":")
                if self.path != "/token" or endpoint.clients.get(client_id) != secret:
                    self._reply(401, {"error": "invalid_client"})
                    return
                now = int(time.time())
                token = jwt.encode({"alg": "RS256", "kid": "txstream-test"},
                                   {"sub": client_id, "iat": now, "exp": now + lifetime_s, "scope": "kafka"},
                                   endpoint.key)
                endpoint.issued += 1
                self._reply(200, {"access_token": token, "token_type": "bearer", "expires_in": lifetime_s})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def token_url(self) -> str:
        return f"{self.base}/token"

    @property
    def jwks_url(self) -> str:
        return f"{self.base}/jwks"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
