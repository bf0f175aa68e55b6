"""What a daemon with these settings starts with, for ``tuner report`` on a state dir
that has no policies yet: the model, whether it tunes, its classes and how soon each has
evidence of its own."""

from __future__ import annotations

from dataclasses import dataclass

from tuner.classify.classes import load_definitions
from tuner.daemon.plan import tuning_config
from tuner.settings import Settings
from tuner.upstream.launch import DEFAULT_MODEL_NAME

__all__ = ["Outlook", "outlook"]


@dataclass(frozen=True, slots=True)
class Outlook:
    model: str
    engine: str
    tuning_off: str | None  # why the daemon will not tune; None: it tunes
    classes: tuple[str, ...]
    own_policy_after: int  # measured requests before a class stops borrowing its parent's
    trial_requests: int  # requests of its class one trial (one variant) is measured on
    explore_share: float  # of each class's time that trials may cost
    replays: bool  # answers are replayed through the n-gram variants (the opening's evidence)


def outlook(settings: Settings) -> Outlook:
    """Read from the settings and the files they name; nothing is built or started."""
    config = tuning_config(settings)
    if settings.upstream_url is not None:
        off: str | None = "--upstream-url: your server is served as it is, without tuning"
    elif not settings.tune:
        off = "TUNER_TUNE=false: served without speculation, nothing learned"
    else:
        off = None
    return Outlook(
        model=settings.model.stem if settings.model else DEFAULT_MODEL_NAME,
        engine=settings.engine,
        tuning_off=off,
        classes=tuple(load_definitions(settings.classes_file).all_classes()),
        own_policy_after=config.budget.min_class_requests,
        trial_requests=config.budget.trial_requests,
        explore_share=config.budget.explore_share,
        replays=config.guard.replay,
    )
