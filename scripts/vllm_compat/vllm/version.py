"""Version of the vLLM test suite this compatibility layer follows."""

__version__ = "0.34.0"


def _prev_minor_version() -> str:
    major, minor = __version__.split(".")[:2]
    return f"{major}.{int(minor) - 1}"
