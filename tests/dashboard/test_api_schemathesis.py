"""Schemathesis against ``/api/v1/openapi.json``: no 5xx and no response outside the schema.

About 100 generated requests in all (6 per operation), on the seeded database. All checks run
except ``positive_data_acceptance``: OpenAPI cannot say "end after start" or "a known dtype",
so some schema-valid requests rightly get a documented 400 that names the parameter.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks

from tests.support.dashboard_fixtures import seed


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory):
    from vramscope.dashboard.app import create_app

    seeded = seed(tmp_path_factory.mktemp("schemathesis") / "seed.db")
    app = create_app(seeded.config(), seeded.store, clock=seeded.clock)
    return schemathesis.openapi.from_wsgi("/api/v1/openapi.json", app)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_openapi_document(case):
    case.call_and_validate(excluded_checks=[checks.positive_data_acceptance])
