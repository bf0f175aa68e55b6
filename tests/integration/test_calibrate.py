"""``tuner calibrate`` and ``tuner inspect`` against the real llama-server and Gemma."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.profiles import Profile
from tuner.upstream.launch import default_model_path

pytestmark = pytest.mark.llama


def tuner(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={"PATH": "/usr/bin:/bin", "TUNER_STATE_DIR": str(state), "HOME": str(Path.home())},
    )


def test_calibrate_measures_a_rising_verify_curve_and_checks_a_variant(tmp_path: Path) -> None:
    result = tuner(
        "calibrate",
        "--prompts",
        "3",
        "--max-tokens",
        "48",
        "--variants",
        "ngram-simple",
        "--format",
        "json",
        "--state-dir",
        str(tmp_path),
        state=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    profile = Profile.model_validate_json(result.stdout)
    curve = dict(profile.verify_curve)
    assert 1 in curve and 64 in curve
    assert 0.3 < curve[1] < 3.0  # one new token costs about one decode step
    assert curve[64] > 2 * curve[1]  # on two CPU cores verifying 64 tokens is not free
    assert profile.decode_ms > 0
    (check,) = profile.checks
    assert check.variant == "ngram-simple" and check.tokens > 0
    assert check.measured_speedup > 0 and check.predicted_speedup is not None
    saved = list((tmp_path / "profiles").glob("*.json"))
    assert len(saved) == 1 and Profile.model_validate_json(saved[0].read_text()) == profile
    # inspect now uses the calibrated curve for this model on this machine
    inspect = tuner("inspect", "--model", str(default_model_path()), state=tmp_path)
    assert inspect.returncode == 0, inspect.stderr
    assert "calibrated on this machine" in inspect.stdout


def test_inspect_json_on_gemma(tmp_path: Path) -> None:
    result = tuner(
        "inspect", "--model", str(default_model_path()), "--format", "json", state=tmp_path
    )
    data = json.loads(result.stdout)
    assert data["target"]["architecture"] == "gemma3"
    assert data["target"]["experts"] == 0
    assert len(data["envelope"]["speedup"]) == len(data["envelope"]["alphas"])


def test_calibrate_with_a_draft_model_measures_its_cost(tmp_path: Path) -> None:
    """Gemma as its own draft: the draft step costs about one target step (c ~ 1)."""
    model = str(default_model_path())
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tuner",
            "calibrate",
            "--prompts",
            "2",
            "--max-tokens",
            "32",
            "--variants",
            "ngram-simple",
            "--format",
            "json",
            "--state-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "TUNER_DRAFT_MODEL": model},
    )
    assert result.returncode == 0, result.stderr
    profile = Profile.model_validate_json(result.stdout)
    assert profile.draft_cost is not None and 0.5 < profile.draft_cost < 2.0
    variants = {check.variant: check for check in profile.checks}
    assert set(variants) == {"ngram-simple", "draft-simple"}
    draft = variants["draft-simple"]
    assert draft.tokens > 0 and draft.alpha is not None and draft.alpha > 0.5  # same model
