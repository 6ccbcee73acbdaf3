"""A bounded property-based fuzzer over a rollway server's own OpenAPI document (schemathesis
strategies driven by hypothesis): valid and invalid requests for every documented operation,
against the real server on loopback. Every answer must be below 500, and every error a JSON
body in rollway's error shape."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import hypothesis.strategies as st
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import Case, GenerationMode

#: Prepares a generated case for the server (keys, a known rollout id); gets a coin to vary.
Prepare = Callable[[Case, bool], None]


@dataclass
class FuzzReport:
    calls: int = 0
    statuses: dict[str, set[int]] = field(default_factory=dict)


def fuzz(url: str, prepare: Prepare, *, max_examples: int) -> FuzzReport:
    """Run ``max_examples`` positive and as many negative cases per operation."""
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    report = FuzzReport()
    session = requests.Session()
    for result in schema.get_all_operations():
        operation = result.ok()
        report.statuses[operation.label] = set()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(
                max_examples=max_examples,
                deadline=None,  # a loaded machine is slow; the count bounds the run
                database=None,
                # The same cases every run: a suite that passes once passes again, and the
                # status assertions below cannot hinge on a lucky draw.
                derandomize=True,
                phases=[Phase.generate, Phase.shrink],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode), coin=st.booleans())
            def run(case: Case, coin: bool) -> None:
                prepare(case, coin)
                response = case.call(base_url=url, session=session, timeout=30)
                report.calls += 1
                report.statuses[case.operation.label].add(response.status_code)
                check_answer(case, response)

            try:
                run()
            except Unsatisfiable:  # nothing to make invalid (no body, no parameters)
                assert mode is GenerationMode.NEGATIVE
    session.close()
    return report


def check_answer(case: Case, response: schemathesis.Response) -> None:
    where = f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:300]}"
    assert response.status_code < 500, where
    headers = {name.lower(): values for name, values in response.headers.items()}
    media = headers.get("content-type", [""])[0]
    if response.status_code >= 400:
        assert media.startswith("application/json"), where
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["type"], where
    else:
        # The document says what the answer is: a client generated from it can read it.
        answers = case.operation.definition.raw["responses"][str(response.status_code)]
        documented = {kind.split(";")[0] for kind in answers["content"]}
        assert media.split(";")[0] in documented, where
