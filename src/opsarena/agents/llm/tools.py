"""The llm agent's tools: their schemas, checking a call's arguments, and running them.

`bash` runs a command through `bash -c` in a non-interactive environment (`PAGER=cat`,
`SYSTEMD_PAGER=`, `DEBIAN_FRONTEND=noninteractive`; stdin is empty), optionally as a
persistent session (working directory and exported variables carried from call to call;
a call past its timeout is still killed); `read_file` reads a
byte range of a file; `write_file` replaces a file; `done` ends the run. What the model
sees of a command's output is its head and tail (`context.head_tail`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from opsarena.agents.llm.context import head_tail
from opsarena.errors import HostError, HostFileError, HostUnavailableError
from opsarena.hosts import ExecResult, Host

TOOL_OUTPUT_LIMIT = 16 * 1024
"""Characters of each output stream (and of a file read) the model sees from one call."""
CAPTURE_LIMIT = 1024 * 1024
"""Bytes of each stream taken from the host, of which the head and tail are shown."""
DEFAULT_BASH_TIMEOUT = 120.0
MAX_BASH_TIMEOUT = 900.0
READ_FILE_LIMIT = 4 * 1024 * 1024

NONINTERACTIVE = "export PAGER=cat GIT_PAGER=cat SYSTEMD_PAGER= DEBIAN_FRONTEND=noninteractive\n"
"""Prefixed to every bash command: no pager or prompt waits for a terminal."""
SESSION_STATE = "/run/opsarena-llm-shell.env"
"""Where a persistent session keeps its working directory and exported environment,
inside the host. /run is emptied by a reboot, as a real shell would be lost."""
SESSION_OPEN = (
    "[ -r STATE ] && . STATE\n"
    'cd "${OPSARENA_SHELL_CWD:-/root}" 2>/dev/null || cd /\n'
    "__opsarena_save() { { export -p | grep -v -e ' OPSARENA_SHELL_CWD=' -e ' PWD='"
    " -e ' OLDPWD=' -e ' SHLVL='; printf 'OPSARENA_SHELL_CWD=%q\\n' \"$PWD\"; }"
    " > STATE.new && mv STATE.new STATE; }\n"
    "trap __opsarena_save EXIT\n"
).replace("STATE", SESSION_STATE)
"""Prefixed to a command of a persistent session: restore, and save again on exit."""


def bash_script(command: str, *, persistent: bool) -> str:
    """The script `bash -c` runs for one `bash` call: non-interactive, and for a persistent
    session with the working directory and exported variables of the previous call."""
    return (SESSION_OPEN if persistent else "") + NONINTERACTIVE + command


TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command in the host with bash -c, as root, stdin empty, no "
            "pager. Returns the exit code, stdout and stderr (long output: head and tail).",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The command to run."},
                    "timeout_s": {
                        "type": "number",
                        "description": f"Seconds before it is killed (at most "
                        f"{MAX_BASH_TIMEOUT:g}).",
                    },
                },
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file in the host, or a part of it.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Absolute path."},
                    "offset": {"type": "integer", "description": "First byte (default 0)."},
                    "length": {
                        "type": "integer",
                        "description": f"Bytes to read (default and at most {TOOL_OUTPUT_LIMIT}).",
                    },
                },
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file in the host, creating parent directories and "
            "replacing any file there.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Absolute path."},
                    "content": {"type": "string", "description": "The whole new content."},
                    "mode": {
                        "type": "string",
                        "description": "Octal mode, e.g. 0755 (default 0644).",
                    },
                },
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "done",
            "description": "Declare that you have finished the brief. Only this ends your run.",
            "parameters": {
                "type": "object",
                "properties": {"summary": {"type": "string", "description": "What you did."}},
                "required": ["summary"],
            },
        },
    },
]

_REQUIRED: dict[str, dict[str, type | tuple[type, ...]]] = {
    "bash": {"command": str},
    "read_file": {"path": str},
    "write_file": {"path": str, "content": str},
    "done": {"summary": str},
}
_OPTIONAL: dict[str, dict[str, type | tuple[type, ...]]] = {
    "bash": {"timeout_s": (int, float)},
    "read_file": {"offset": int, "length": int},
    "write_file": {"mode": str},
}
_MODE_RE = re.compile(r"^0?[0-7]{3,4}$")


class ToolCallError(Exception):
    """A tool call the model got wrong; `str()` is the correction the model is sent."""


def parse_tool_arguments(name: str, arguments: str) -> dict[str, Any]:
    """The arguments of a call to tool `name`, checked. Raises `ToolCallError`."""
    if name not in _REQUIRED:
        raise ToolCallError(f"there is no tool {name!r}; the tools are {', '.join(_REQUIRED)}")
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError as exc:
        raise ToolCallError(f"the arguments of {name} are not valid JSON ({exc})") from None
    if not isinstance(args, dict):
        raise ToolCallError(f"the arguments of {name} must be a JSON object")
    for key, kind in _REQUIRED[name].items():
        if not isinstance(args.get(key), kind):
            raise ToolCallError(f"{name} needs the argument {key!r} ({_type_name(kind)})")
    for key, kind in _OPTIONAL.get(name, {}).items():
        if key in args and (not isinstance(args[key], kind) or isinstance(args[key], bool)):
            raise ToolCallError(f"{name}'s argument {key!r} must be {_type_name(kind)}")
    if name == "bash" and "timeout_s" in args and not 0 < args["timeout_s"] < float("inf"):
        raise ToolCallError(
            f"timeout_s must be a number of seconds above 0, not {args['timeout_s']}"
        )
    for key in ("offset", "length"):
        if name == "read_file" and key in args and args[key] < (0 if key == "offset" else 1):
            raise ToolCallError(
                f"read_file's {key} must be {'0 or more' if key == 'offset' else 'above 0'}"
            )
    if name == "write_file" and "mode" in args and not _MODE_RE.match(args["mode"]):
        raise ToolCallError(f"mode {args['mode']!r} is not an octal mode like 0644")
    if name in ("read_file", "write_file") and not args["path"].startswith("/"):
        raise ToolCallError(f"path {args['path']!r} must be absolute")
    return args


def _type_name(kind: type | tuple[type, ...]) -> str:
    if kind is str:
        return "a string"
    return "an integer" if kind is int else "a number"


def format_exec_result(result: ExecResult, timeout: float, limit: int) -> str:
    """What the model sees of one bash call: each stream's head and tail."""
    lines = [f"exit code: {result.exit_code}"]
    if result.timed_out:
        lines.append(f"(killed after {timeout:g}s: the command ran past its timeout)")
    for label, data in (("stdout", result.stdout), ("stderr", result.stderr)):
        if data:
            lines.append(f"{label}:\n{head_tail(data.decode(errors='replace'), limit)}")
    if result.truncated:
        lines.append(f"(output past {CAPTURE_LIMIT} bytes on a stream: the command was ended)")
    return "\n".join(lines)


def read_slice(data: bytes, offset: int, length: int) -> str:
    """What the model sees of `read_file`: bytes [offset, offset+length) and where they lie."""
    part = data[offset : offset + length]
    text = part.decode(errors="replace")
    if offset or offset + length < len(data):
        end = offset + len(part)
        text += f"\n[bytes {offset}-{end} of {len(data)}; read on with offset={end}]"
    return text


async def run_tool(
    host: Host,
    name: str,
    args: dict[str, Any],
    *,
    bash_timeout_s: float,
    limit: int,
    persistent: bool = False,
) -> str:
    """Run one checked call on `host`; host failures come back as the model's error text."""
    try:
        if name == "bash":
            timeout = min(float(args.get("timeout_s") or bash_timeout_s), MAX_BASH_TIMEOUT)
            result = await host.exec(
                bash_script(args["command"], persistent=persistent),
                timeout=timeout,
                output_limit=CAPTURE_LIMIT,
            )
            return format_exec_result(result, timeout, limit)
        if name == "read_file":
            data = await host.read_file(args["path"], limit=READ_FILE_LIMIT)
            length = min(int(args.get("length") or limit), limit)
            return read_slice(data, int(args.get("offset") or 0), length)
        content = args["content"].encode()
        await host.write_file(args["path"], content, mode=int(args.get("mode", "644"), 8))
        return f"wrote {len(content)} bytes to {args['path']}"
    except HostUnavailableError as exc:
        return (
            f"Error: the host is not reachable right now (it may be rebooting): {exc}. "
            "Wait a few seconds and try again."
        )
    except HostFileError as exc:
        return f"Error: {exc}"
    except HostError as exc:
        return f"Error: the host could not do it: {exc}"
