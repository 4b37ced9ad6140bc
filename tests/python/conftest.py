import pytest

import eagervm


@pytest.fixture(params=["cpu:0", "mock:0"])
def device(request):
    """Every value test runs on the host and on the mock asynchronous device."""
    return request.param


@pytest.fixture
def vm():
    return eagervm.VM(mock_devices=2, mock_jitter_us=20)
