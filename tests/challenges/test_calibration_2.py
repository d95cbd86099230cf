"""Calibration runs of shard 2 (tests/challenges/calibration.py deals them)."""

from tests.challenges.calibration import calibration_test

test_calibration = calibration_test(shard=2)
