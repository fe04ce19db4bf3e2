"""Runs inside the sandbox (local jail or container): read {source, name, arguments, env} as JSON on stdin,
set `env` (the local jail passes the tool's variables this way: never through the host processes that
build the jail, where LD_PRELOAD or LD_DEBUG_OUTPUT would act as root), call the function, write
{ok, value | error} as JSON to $TOOL_RESULT_PATH. Standard library only."""

import json
import os
import sys
import traceback


def main() -> None:
    payload = json.loads(sys.stdin.read())
    result_path = os.environ.pop("TOOL_RESULT_PATH")
    os.environ.update(payload.get("env") or {})
    namespace = {"__name__": "__tool__"}
    try:
        exec(compile(payload["source"], "<tool>", "exec"), namespace)
        value = namespace[payload["name"]](**payload["arguments"])
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            value = repr(value)
        result = {"ok": True, "value": value}
    except BaseException:
        result = {"ok": False, "error": traceback.format_exc(limit=8)}
    with open(result_path, "w") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main()
