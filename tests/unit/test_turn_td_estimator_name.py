"""`turn_td` is named for what it is; the old name `archer` is refused with one line that says why
(docs/estimators.md, "turn_td")."""
from __future__ import annotations

import pytest

from turnstream.core.config import ConfigError, LearnerSection, load_config
from turnstream.core.config_learner import CRITIC_ESTIMATORS
from turnstream.learner.estimators.registry import ESTIMATORS


def test_archer_is_refused_with_the_new_name_and_the_reason():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["learner.estimator=archer"])
    message = str(info.value)
    assert "\n" not in message and message.startswith("learner.estimator: archer was renamed turn_td")
    assert "not ArCHer" in message


def test_turn_td_is_a_critic_estimator_and_archer_no_estimator_at_all():
    assert load_config(None, ["learner.estimator=turn_td"]).learner.estimator == "turn_td"
    assert "turn_td" in CRITIC_ESTIMATORS and "turn_td" in ESTIMATORS
    assert "archer" not in CRITIC_ESTIMATORS and "archer" not in ESTIMATORS
    assert "archer" not in LearnerSection.model_fields["estimator"].description
