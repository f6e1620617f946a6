"""A verb's arguments from Python values, through the verb's own parser: what the Python API calls pass on.

``verb_namespace(register, verb, argv, values)`` builds the verb's parser (its
``register(subparsers)``), parses the required part ``argv`` as the command line would, then
sets each of ``values`` on the result. So a function of the Python API gets every default the
verb has, by construction, and an option the verb does not have is one line. The flags every
verb shares are checked, and the secrets gathered, as ``cli.main`` does.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn

from sysbench_gpu.core.arguments import check_shared_flags
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.redact import Secrets, install_log_redaction


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise SysbenchError(message)


def verb_namespace(
    register: Callable[[Any], None], verb: str, argv: Sequence[str], values: Mapping[str, Any]
) -> argparse.Namespace:
    """The namespace the verb's function gets for ``argv`` plus ``values`` (argparse dests), checked."""
    parser = _RaisingParser(prog="sysbench-gpu", add_help=False)
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args([verb, *argv])
    for name, value in values.items():
        if not hasattr(args, name):
            raise SysbenchError(f"{verb}: no option {name!r}")
        setattr(args, name, value)
    # The secrets this call can meet, as cli.main gathers them: kept out of logs and manifests.
    args.secrets = Secrets.gather(
        getattr(args, "api_key_env", None) or "OPENAI_API_KEY", getattr(args, "base_url", None)
    )
    install_log_redaction(args.secrets)
    check_shared_flags(args)
    return args


def session_text(sessions: str | Iterable[int] | None) -> str | None:
    """Session ids as the ``--sessions`` flag writes them (``"1,2,5"``); text passes as given."""
    if sessions is None or isinstance(sessions, str):
        return sessions
    return ",".join(str(int(system_id)) for system_id in sessions)
