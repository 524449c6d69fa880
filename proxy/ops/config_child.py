"""`interlock serve`'s configuration, read and validated by a child process.

Validating the file takes PyYAML, pydantic and the configuration's models: about 12 MB resident
for the life of a process that imports them, and a proxy needs none of it once the file is read
(the rest of the code sees `policies.model`'s plain values). So `serve` runs
`python -m proxy.ops.config_child FILE` (`proxy.child_process`), which validates the file as
`check-config` does and writes, after a marker, the effective configuration (pickled: between two
processes of the same installation, never stored, and unpickled to `policies.model`'s classes
only) or the `ConfigError` with its file, line and key, unchanged. Whatever else reaches the
child's standard output (an interpreter start-up hook, say) is ignored. The child's environment
and working directory are serve's own, so `${VAR}` references and relative paths resolve the same.

If the child cannot start or its answer cannot be read (no interpreter to run, killed, a frozen
build), serve validates in-process, as before, and logs why: the configuration is never skipped.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import subprocess
import sys
from typing import Any

from policies import model
from policies.config_errors import ConfigError
from policies.model import Config
from proxy.child_process import child_argv, child_environment, children_possible

__all__ = ["load_config_in_child"]

log = logging.getLogger("interlock")

_INVALID = 3  # the child's exit status for an invalid file (its error follows the marker, as JSON)
_MARKER = b"\n--interlock-config--\n"
_TIMEOUT_S = 60.0
_CHILD_ERROR_CHARS = 2000
_BUILTINS = frozenset({"frozenset", "set", "tuple", "list", "dict", "int", "float", "str", "bool"})


def load_config_in_child(path: str | os.PathLike[str]) -> Config:
    """The configuration at `path`, validated by a child process (see the module note).

    Raises:
        ConfigError: the file is missing, unreadable or invalid, worded as `load_config` words it.
    """
    if not children_possible():
        return _in_process(path, "a frozen build starts no child")
    argv = [*child_argv("proxy.ops.config_child"), os.fspath(path)]
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env=child_environment(),
            timeout=_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return _in_process(path, f"the child did not run: {error}")
    _, marker, answer = done.stdout.rpartition(_MARKER)
    if marker and done.returncode == _INVALID:
        try:
            found = json.loads(answer)
            refusal = ConfigError(found["message"], path=found["path"], line=found["line"])
        except (ValueError, KeyError, TypeError) as unreadable:
            return _in_process(path, f"the child's refusal could not be read: {unreadable!r}")
        raise refusal
    if marker and done.returncode == 0:
        try:
            config = _ModelUnpickler(io.BytesIO(answer)).load()
        except (pickle.UnpicklingError, ValueError, EOFError, AttributeError) as unreadable:
            return _in_process(path, f"the child's answer could not be read: {unreadable!r}")
        if isinstance(config, Config):
            return config
        return _in_process(path, f"the child answered a {type(config).__name__}")
    detail = done.stderr.decode(errors="replace").strip()[-_CHILD_ERROR_CHARS:]
    return _in_process(path, f"the child failed (exit {done.returncode}): {detail or 'no message'}")


class _ModelUnpickler(pickle.Unpickler):
    """Unpickles the configuration's plain values and nothing else (no other class is built)."""

    def find_class(self, module_name: str, name: str) -> Any:
        if module_name == "policies.model" and name in model.__all__:
            return getattr(model, name)
        if module_name == "builtins" and name in _BUILTINS:
            return super().find_class(module_name, name)
        raise pickle.UnpicklingError(f"the configuration holds no {module_name}.{name}")


def _in_process(path: str | os.PathLike[str], why: str) -> Config:
    log.warning("configuration validated in this process instead of a child: %s", why)
    from policies.config import load_config  # only now: what validates it stays out otherwise

    return load_config(path)


def _main(path: str) -> int:
    answer = sys.stdout.buffer
    sys.stdout = sys.stderr  # anything else printed while validating stays off the answer
    from policies.config import load_config

    try:
        config = load_config(path)
    except ConfigError as error:
        found = {"message": str(error), "path": error.path, "line": error.line}
        answer.write(_MARKER + json.dumps(found).encode())
        answer.flush()
        return _INVALID
    answer.write(_MARKER + pickle.dumps(config, protocol=pickle.HIGHEST_PROTOCOL))
    answer.flush()
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m proxy.ops.config_child CONFIG_FILE")
    raise SystemExit(_main(sys.argv[1]))
