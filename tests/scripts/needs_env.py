"""Crashes at start-up on a missing environment variable, on every attempt."""

import os

token = os.environ["DTLAUNCH_TEST_NEVER_SET"]
