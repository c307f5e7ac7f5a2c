"""verl coupling in one place (envace.train.verl_ext.coupling): every verl member we override, call privately,
re-implement or rely on is listed, its source is the one we checked, and the version is the pinned one."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest

from envace.train.verl_ext import coupling
from envace.train.verl_ext.cpu import UnsupportedVersion


@pytest.fixture(scope="module")
def classes() -> list[type]:
    import envace.train.verl_ext.cpu.platform  # noqa: F401  (the CPU platform first, as in every verl process)
    from envace.train.verl_ext import agent_loop, per_role_trainer, trainer, weight_sync

    return [trainer.EnvaceTrainer, per_role_trainer.PerRoleTrainer,
            per_role_trainer.OwnServerActorRolloutRefWorker, per_role_trainer.PolicyServerManager,
            agent_loop.EnvaceAgentLoop, weight_sync.EnvaceServerAdapter, weight_sync.EnvaceHttpServer,
            weight_sync.EnvaceReplica]


def test_every_listed_verl_member_is_unchanged(classes):
    assert coupling.drifted() == []


def test_every_verl_member_our_classes_override_or_call_privately_is_listed(classes):
    """Scan each envace subclass of a verl class: members it defines that a verl base also defines
    (overrides), and private members it reaches through ``self.`` / ``super().`` that a verl base defines
    (calls). Abstract members (verl's interfaces) are not couplings."""
    listed = {(c.target, c.site.rsplit(".", 1)[0]) for c in coupling.COUPLINGS}
    found = set()
    for cls in classes:
        site = f"{cls.__module__}:{cls.__qualname__}"
        used = set(re.findall(r"(?:self|super\(\))\.(_\w+)", inspect.getsource(cls)))
        for name in set(vars(cls)) | used:
            if (name.startswith("__") and name != "__init__") or name.startswith("_abc"):
                continue  # Python's and abc's machinery
            # the nearest base defining it: one of ours (listed at that class) or verl's
            owner = next((b for b in cls.__mro__[1:] if name in vars(b)), None)
            if owner is None or not owner.__module__.startswith("verl"):
                continue
            if getattr(vars(owner)[name], "__isabstractmethod__", False):
                continue
            found.add((f"{owner.__module__}:{owner.__qualname__}.{name}", site))
    assert found - listed == set(), \
        "verl members used by envace but not listed in envace.train.verl_ext.coupling"
    # the scan is not vacuous: it finds an override, a private call and the re-implemented step
    assert {("verl.trainer.ppo.v1.trainer_base:PPOTrainer._compute_advantage",
             "envace.train.verl_ext.trainer:EnvaceTrainer"),
            ("verl.trainer.ppo.v1.trainer_base:PPOTrainer._compute_reward_colocate",
             "envace.train.verl_ext.per_role_trainer:PerRoleTrainer"),
            ("verl.trainer.ppo.v1.trainer_base:PPOTrainer._step_once",
             "envace.train.verl_ext.per_role_trainer:PerRoleTrainer")} <= found


def test_a_changed_verl_member_is_reported_with_our_site():
    first = coupling.COUPLINGS[0]
    stale = dataclasses.replace(first, sha256="0" * 16)
    (message,) = coupling.drifted((stale,))
    assert first.target in message and first.site in message and "changed" in message
    gone = dataclasses.replace(first, target="verl.trainer.ppo.v1.trainer_base:PPOTrainer.no_such_member")
    assert "cannot be read" in coupling.drifted((gone,))[0]


def test_only_the_pinned_verl_is_accepted(monkeypatch):
    assert coupling.check_verl_version() == coupling.PINNED_VERL
    import envace.train.verl_ext.cpu as cpu

    monkeypatch.setattr(cpu, "_installed", lambda dist: "0.10.0")
    with pytest.raises(UnsupportedVersion, match="verl 0.9.1 but verl 0.10.0"):
        coupling.check_verl_version()
