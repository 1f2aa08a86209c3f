"""Numbers a minion sends that the control plane stores must fit the store's columns (an exit code in a
32-bit integer, a log offset or byte count in a 64-bit one, a worker's number below WORKER_NUMBERS): past
them the store refuses the write, which must be a 422 at the door and not a 500 at the commit. The API
fuzzer (tests/provisioner/test_fuzz_api.py) found the log route answering 500 for a worker number of 27
digits."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from contracts.device import InferenceReport
from contracts.jobs import LogChunk, WorkerReport

REPORT = {"job_id": "j1", "worker": 0, "generation": "j1.1", "state": "exited"}
INFERENCE = {"generation": "d1", "state": "running"}


@pytest.mark.parametrize(
    ("model", "fields", "fits", "too_big"),
    [
        (LogChunk, {"data": "x"}, {"offset": 2**63 - 1}, {"offset": 2**63}),
        (WorkerReport, REPORT, {"exit_code": -(2**31)}, {"exit_code": 2**31}),
        (WorkerReport, REPORT, {"log_acked": 2**63 - 1}, {"log_acked": 2**63}),
        (WorkerReport, REPORT, {"worker": 9_999}, {"worker": 10**27}),
        (InferenceReport, INFERENCE, {"exit_code": 2**31 - 1}, {"exit_code": -(2**31) - 1}),
        (InferenceReport, INFERENCE, {"log_acked": 0}, {"log_acked": 2**64}),
    ],
)
def test_a_number_the_store_cannot_hold_is_refused(
    model: type[BaseModel], fields: dict[str, Any], fits: dict[str, Any], too_big: dict[str, Any]
) -> None:
    model.model_validate({**fields, **fits})
    with pytest.raises(ValidationError):
        model.model_validate({**fields, **too_big})
