"""opsarena: live infrastructure challenges on isolated systemd hosts, judged by a referee."""

__version__ = "0.1.0"
