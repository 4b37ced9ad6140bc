import os
import sys

import pytest

if os.environ.get("EAGERVM_TEST_WITHOUT_ML_DTYPES") == "1":
    # Run the suite as if ml_dtypes were not installed (it is optional): bfloat16 is then
    # checked through float32 (helpers.py).
    sys.modules["ml_dtypes"] = None

import eagervm


@pytest.fixture(params=["cpu:0", "mock:0"])
def device(request):
    """Every value test runs on the host and on the mock asynchronous device."""
    return request.param


@pytest.fixture
def vm():
    return eagervm.VM(mock_devices=2, mock_jitter_us=20)
