"""What ``packfeed serve`` listens on, checked before it starts: the port (``port_problem``: why
a bind fails, in words a user can act on) and the TLS pair (``check_tls_files``). Standard
library only.
"""

from __future__ import annotations


def port_problem(host: str, port: int) -> str | None:
    """Why binding ``host:port`` fails, found by trying it with a plain socket; None if it binds."""
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # As gRPC binds: connections of a previous server in TIME_WAIT do not block, a listener does.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host.strip("[]"), port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return f"port {port} is in use (another server?): choose another --port, or 0 for any free port"
            if e.errno == errno.EADDRNOTAVAIL:
                return f"{host} is not an address of this machine (--host)"
            if e.errno == errno.EACCES:
                return f"no permission to listen on port {port} (ports below 1024 need privileges)"
            return e.strerror or str(e)
    return None


def check_tls_files(cert: bytes, key: bytes, cert_path: str, key_path: str) -> None:
    """ValueError naming the file at fault unless ``cert``/``key`` form a usable TLS pair."""
    import ssl
    import tempfile

    if b"-----BEGIN" not in cert or b"CERTIFICATE" not in cert:
        raise ValueError(f"--tls-cert {cert_path} is not a PEM certificate")
    if b"-----BEGIN" not in key or b"PRIVATE KEY" not in key:
        raise ValueError(f"--tls-key {key_path} is not a PEM private key")
    if b"ENCRYPTED" in key:  # gRPC cannot use it, and OpenSSL would ask for its passphrase on the terminal
        raise ValueError(f"--tls-key {key_path} is encrypted: give the key without a passphrase "
                         "(e.g. openssl pkey -in KEY -out PLAIN_KEY), kept in a Kubernetes Secret or a 0600 file")
    with tempfile.TemporaryDirectory() as tmp:
        c, k = f"{tmp}/cert.pem", f"{tmp}/key.pem"
        with open(c, "wb") as f:
            f.write(cert)
        with open(k, "wb") as f:
            f.write(key)
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(c, k, password=lambda: b"")  # never prompt
        except ssl.SSLError as e:
            if "KEY_VALUES_MISMATCH" in str(e) or "key values mismatch" in str(e):
                raise ValueError(f"--tls-key {key_path} is not the private key of --tls-cert {cert_path}") from None
            raise ValueError(f"--tls-cert {cert_path} / --tls-key {key_path}: not a usable TLS pair ({e.reason or e})") from None
