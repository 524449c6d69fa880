"""`interlock serve`'s configuration, read and validated by a child process.

Validating the file takes PyYAML, pydantic and the configuration's models: about 12 MB resident
for the life of a process that imports them, and a proxy needs none of it once the file is read
(the rest of the code sees `policies.model`'s plain values). So `serve` runs
`python -m proxy.ops.config_child FILE`, which validates the file as `check-config` does and
writes the effective configuration to its standard output (pickled: between two processes of the
same program, never stored), or the `ConfigError` with its file, line and key, unchanged. The
child's environment is serve's own, so `${VAR}` references resolve the same.

If the child cannot start or fails for another reason (no interpreter to run, killed), serve
validates in-process, as before, and logs why: the configuration is never skipped.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys

from policies.config_errors import ConfigError
from policies.model import Config

__all__ = ["load_config_in_child"]

log = logging.getLogger("interlock")

_INVALID = 3  # the child's exit status for an invalid file (its error is on stdout, as JSON)
_TIMEOUT_S = 60.0
_CHILD_ERROR_CHARS = 2000


def load_config_in_child(path: str | os.PathLike[str]) -> Config:
    """The configuration at `path`, validated by a child process (see the module note).

    Raises:
        ConfigError: the file is missing, unreadable or invalid, worded as `load_config` words it.
    """
    argv = [sys.executable, "-m", "proxy.ops.config_child", os.fspath(path)]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return _in_process(path, f"the child did not run: {error}")
    if done.returncode == _INVALID:
        found = json.loads(done.stdout)
        raise ConfigError(found["message"], path=found["path"], line=found["line"])
    if done.returncode == 0:
        config = pickle.loads(done.stdout)  # our own child's answer, over a pipe
        if isinstance(config, Config):
            return config
        return _in_process(path, f"the child answered a {type(config).__name__}")
    detail = done.stderr.decode(errors="replace").strip()[-_CHILD_ERROR_CHARS:]
    return _in_process(path, f"the child failed (exit {done.returncode}): {detail or 'no message'}")


def _in_process(path: str | os.PathLike[str], why: str) -> Config:
    log.warning("configuration validated in this process instead of a child: %s", why)
    from policies.config import load_config  # only now: what validates it stays out otherwise

    return load_config(path)


def _main(path: str) -> int:
    from policies.config import load_config

    try:
        config = load_config(path)
    except ConfigError as error:
        found = {"message": str(error), "path": error.path, "line": error.line}
        sys.stdout.write(json.dumps(found))
        return _INVALID
    sys.stdout.buffer.write(pickle.dumps(config, protocol=pickle.HIGHEST_PROTOCOL))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m proxy.ops.config_child CONFIG_FILE")
    raise SystemExit(_main(sys.argv[1]))
