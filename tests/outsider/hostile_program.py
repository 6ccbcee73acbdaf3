"""A hostile `--cmd` program for the outside re-test (issue 36): what it does is the task's `kind`.

Kept outside /tmp so that the namespace sandbox sees it. argv[1], when given, is a marker that
every process it forks carries in its command line, so a test can look for leftovers.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request


def _chat() -> None:
    base = os.environ["OPENAI_BASE_URL"].rstrip("/")
    messages = [{"role": "user", "content": "hi"}]
    body = {"model": os.environ.get("OPENAI_MODEL", "m"), "max_tokens": 8, "messages": messages}
    request = urllib.request.Request(
        base + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
        },
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        answer.read()


def main() -> int:
    with open(os.environ["ROLLWAY_TASK_FILE"]) as f:
        task = json.load(f)
    kind = task.get("kind", "ok")
    result = os.environ["ROLLWAY_RESULT_FILE"]
    if kind == "write":  # no model call: only whether the host folder took the write
        try:
            with open(os.path.join(task["folder"], "written-by-program"), "w") as f:
                f.write("x")
            wrote = 1.0
        except OSError:
            wrote = 0.0
        with open(result, "w") as f:
            json.dump({"reward": wrote}, f)
        return 0
    _chat()
    if kind == "fifo":
        os.mkfifo(result)
    elif kind == "devzero":
        os.symlink("/dev/zero", result)
    elif kind == "big":
        with open(result, "w") as f:
            f.write(" " * (5 << 20) + "{}")
    elif kind == "fork":
        if os.fork() == 0:
            os.setsid()
            time.sleep(600)
            os._exit(0)
    else:
        time.sleep(float(task.get("sleep_s", 0)))
        with open(result, "w") as f:
            json.dump({"reward": 1.0}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
