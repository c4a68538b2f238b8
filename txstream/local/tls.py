"""A throwaway certificate authority for the local broker's TLS listener (`txstream kafka up --tls`).

Made with the JDK's `keytool`, which every machine that runs Kafka has: no extra Python package.
The CA signs a broker certificate valid for localhost, 127.0.0.1 and the advertised host, and a
client certificate (CN = the client's name) for mutual TLS. Brokers read PKCS#12 keystores;
librdkafka reads the CA as PEM (`ssl.ca.location`) and its own certificate from a PKCS#12
keystore (`ssl.keystore.location`, `ssl.keystore.password`).
"""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from txstream.errors import BrokerError

DAYS = 30


@dataclass(frozen=True)
class TlsMaterial:
    directory: str
    password: str = field(repr=False)   # every keystore's (a throwaway: the files live in the cluster's own directory)

    @property
    def ca_pem(self) -> str:
        return os.path.join(self.directory, "ca.pem")

    @property
    def broker_keystore(self) -> str:
        return os.path.join(self.directory, "broker.p12")

    @property
    def truststore(self) -> str:
        return os.path.join(self.directory, "truststore.p12")

    @property
    def client_keystore(self) -> str:
        return os.path.join(self.directory, "client.p12")


def _keytool(*args: str) -> str:
    keytool = shutil.which("keytool") or os.path.join(os.path.dirname(os.path.realpath(shutil.which("java") or "")),
                                                      "keytool")
    done = subprocess.run([keytool, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise BrokerError(f"keytool {args[0]} failed making the local broker's certificates: "
                          f"{(done.stderr or done.stdout).strip()}")
    return done.stdout


def make_tls_material(directory: str | Path, hosts: list[str], client: str = "txstream-client") -> TlsMaterial:
    """The CA, the broker's keystore and truststore and a client keystore in `directory`, made
    once (kept across restarts of the cluster, so clients' CA file stays valid)."""
    directory = Path(directory)
    password_file = directory / "password"
    if password_file.exists() and (directory / "client.p12").exists():
        return TlsMaterial(str(directory), password_file.read_text().strip())
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True, mode=0o700)
    password = secrets.token_urlsafe(18)
    material = TlsMaterial(str(directory), password)
    store = ("-storetype", "PKCS12", "-storepass", password)
    ca = str(directory / "ca.p12")
    _keytool("-genkeypair", "-alias", "ca", "-dname", "CN=txstream local CA", "-keyalg", "RSA", "-keysize", "2048",
             "-ext", "bc:c", "-validity", str(DAYS), "-keystore", ca, *store)
    Path(material.ca_pem).write_text(_keytool("-exportcert", "-rfc", "-alias", "ca", "-keystore", ca, *store))
    _keytool("-importcert", "-noprompt", "-alias", "ca", "-file", material.ca_pem,
             "-keystore", material.truststore, *store)
    names = ",".join(f"ip:{h}" if h.replace(".", "").isdigit() else f"dns:{h}"
                     for h in dict.fromkeys(["localhost", "127.0.0.1", *hosts]))
    for alias, keystore, dname, ext in (("broker", material.broker_keystore, "CN=localhost", f"SAN={names}"),
                                        ("client", material.client_keystore, f"CN={client}", None)):
        _keytool("-genkeypair", "-alias", alias, "-dname", dname, "-keyalg", "RSA", "-keysize", "2048",
                 "-validity", str(DAYS), "-keystore", keystore, *store)
        request = _keytool("-certreq", "-alias", alias, "-keystore", keystore, *store)
        csr = directory / f"{alias}.csr"
        csr.write_text(request)
        signed = _keytool("-gencert", "-rfc", "-alias", "ca", "-keystore", ca, *store, "-infile", str(csr),
                          "-validity", str(DAYS), *(("-ext", ext) if ext else ()))
        crt = directory / f"{alias}.crt"
        crt.write_text(signed)
        _keytool("-importcert", "-noprompt", "-alias", "ca", "-file", material.ca_pem, "-keystore", keystore, *store)
        _keytool("-importcert", "-noprompt", "-alias", alias, "-file", str(crt), "-keystore", keystore, *store)
    password_file.write_text(password)
    password_file.chmod(0o600)
    return material
