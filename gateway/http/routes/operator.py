"""Operator routes: remove a run's retained log now (`DELETE /v1/runs/{run_id}` → 204).

The run record stays (readers of an ended run still learn how it ended); open readers
get a gap or their END, per the bridge's cleanup rules.
"""

from __future__ import annotations

from typing import Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...errors import RunNotFound
from ...names import check_run_id
from ..edge import access
from ..openapi import READER_ERRORS, Operation, Reply, document
from ..responses import no_content
from ..state import gateway_state


@document(
    Operation(
        "Remove the run's retained log now (the record stays)",
        "operator",
        {204: Reply("Removed")},
        READER_ERRORS,
    )
)
async def delete_run(request: Request) -> Response:
    access.operator(request)
    state = gateway_state(request)
    run_id = check_run_id(request.path_params["run_id"])
    if await state.bridge.get_run(run_id) is None:
        raise RunNotFound(f"run {run_id} not found")
    await state.bridge.cleanup(run_id)
    return no_content()


routes: Final = [Route("/v1/runs/{run_id}", delete_run, methods=["DELETE"])]
