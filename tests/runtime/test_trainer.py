"""The Trainer boundary: loading one by name, what a checkpoint must hold for it, and a second
trainer (JSON payloads, linear regression: tests/runtime/trainers.py) run by the same runtime."""

import json

import pytest
import torch

from kale_airflow.core.slices import Slice
from kale_airflow.runtime.model import CTRTrainer
from kale_airflow.runtime.trainer import RUNTIME_KEYS, Trainer, TrainerError, check_state_keys, load_trainer, state_problem
from kale_airflow.runtime.worker import Worker
from kale_airflow.stream.embedded import EmbeddedStream
from tests.conftest import audit_coverage
from tests.runtime.trainers import TRUE_W, JSONRegression, make_payloads

SPEC = "tests.runtime.trainers:JSONRegression"


def test_a_trainer_is_named_module_colon_attribute_or_is_the_ctr_model():
    assert isinstance(load_trainer(None), CTRTrainer) and load_trainer(None, lr=0.5).lr == 0.5
    made = load_trainer(SPEC)  # a class: made without arguments
    assert isinstance(made, JSONRegression) and isinstance(made, Trainer)


@pytest.mark.parametrize("spec, message", [
    ("no-colon", "is not 'module:attribute'"),
    ("no_such_module_kale:X", "cannot import no_such_module_kale"),
    ("tests.runtime.trainers:Nope", "has no attribute Nope"),
    ("tests.runtime.trainers:make_payloads", "cannot be made without arguments"),
    ("tests.runtime.trainers:FEATURES", "is not a Trainer: it lacks build, decode"),
], ids=["syntax", "module", "attribute", "needs-arguments", "not-a-trainer"])
def test_a_trainer_that_cannot_be_loaded_is_refused_naming_why(spec, message):
    with pytest.raises(TrainerError, match=message):
        load_trainer(spec)


class Shaped:
    """Has a shape but no dtype: not a tensor."""

    shape = (2,)


def test_a_foreign_file_is_named_by_its_first_six_keys_or_its_type():
    mine = {"model": {"w": torch.zeros(2, 3)}}
    theirs = {k: 0 for k in "gfedcba"}
    assert state_problem(mine, theirs) == "not a kale-airflow checkpoint (needs model, steps; found " \
                                          "['a', 'b', 'c', 'd', 'e', 'f'])"
    assert state_problem(mine, [1, 2]) == "not a kale-airflow checkpoint (needs model, steps; found list)"


def test_every_module_of_tensors_is_compared_and_only_those():
    other = "a checkpoint of another model (its parameter names or shapes differ)"
    mine = {"meta": {"a": Shaped()}, "optim": {}, "model": {"w": torch.zeros(2, 3)}}  # the module last
    assert state_problem(mine, {"meta": {"b": 1}, "optim": {}, "model": {"w": torch.ones(3)}, "steps": 1}) == other
    assert state_problem(mine, {"meta": {"b": 1}, "optim": {}, "model": {"w": torch.ones(2, 3)}, "steps": 1}) is None
    assert state_problem(mine, {"meta": {}, "optim": {}, "model": {"w": 5}, "steps": 1}) == other  # not a tensor


def test_a_checkpoint_must_hold_the_trainers_keys_with_the_same_shapes():
    mine = {"model": {"w": torch.zeros(2, 3)}, "optim": {"state": {}, "param_groups": []}}
    assert state_problem(mine, {"model": {"w": torch.ones(2, 3)}, "optim": {}, "steps": 1}) is None
    assert "needs model, optim, steps" in state_problem(mine, {"model": {}, "steps": 1})
    assert "another model" in state_problem(mine, {"model": {"w": torch.ones(3)}, "optim": {}, "steps": 1})
    assert "not a kale-airflow checkpoint" in state_problem(mine, [1, 2])
    check_state_keys(mine)
    with pytest.raises(TrainerError, match="uses steps"):
        check_state_keys({"steps": 1, "model": {}})
    assert "slices" in RUNTIME_KEYS


def test_the_runtime_trains_another_trainers_payloads_with_the_same_audit(tmp_path):
    s = EmbeddedStream(tmp_path / "s.db", partitions=2)
    for p in range(2):
        s.append(p, make_payloads(600, p) + ([b"{not json", json.dumps({"x": [1.0], "y": 0}).encode()] if p else []))
        s.append(p, make_payloads(600, 10 + p))
    w = Worker(s, "j", [Slice(0), Slice(1, 0.0, 0.5), Slice(1, 0.5, 1.0)], tmp_path / "ck", batch_size=60,
               trainer=SPEC, audit=tmp_path / "audit.csv", checkpoint_every=5)
    out = w.run(exit_when_idle=True)
    assert out["malformed"] == 2 and out["trained"] == 2400
    weights = w.module.weight.detach().numpy().ravel()
    assert abs(weights - TRUE_W).max() < 0.2, weights  # it learned the regression
    seen = audit_coverage(tmp_path / "audit.csv")
    assert set(seen[0]) == set(range(1200)) and set(seen[1]) == set(range(1202))
    assert max(max(v.values()) for v in seen.values()) == 1
    again = Worker(s, "j", [Slice(0)], tmp_path / "ck", trainer=SPEC)  # its checkpoint restores it
    assert again.steps == w.steps and torch.equal(again.module.weight, w.module.weight)
    with pytest.raises(Exception, match="another model|not a kale-airflow checkpoint"):
        Worker(s, "j", [Slice(0)], tmp_path / "ck")  # the CTR model cannot take the regression's checkpoint


class Outer:
    """A trainer class nested in a namespace (``module:Outer.Inner``)."""

    Inner = JSONRegression


class Half:
    """Has two of the protocol's six methods."""

    def build(self, device, amp=False): ...

    def decode(self, payloads): ...


class CallableTrainer(JSONRegression):
    """A trainer that is also callable: it is the trainer, not a factory."""

    def __call__(self):
        return "not a trainer"


HALF, INSTANCE, CALLABLE = Half(), JSONRegression(), CallableTrainer()
HERE = "tests.runtime.test_trainer"


def test_a_trainer_is_found_through_dotted_attributes_and_an_instance_is_taken_as_it_is():
    assert isinstance(load_trainer(f"{HERE}:Outer.Inner"), JSONRegression)
    assert load_trainer(f"{HERE}:INSTANCE") is INSTANCE and load_trainer(f"{HERE}:CALLABLE") is CALLABLE


@pytest.mark.parametrize("spec, message", [
    ("no_such_module_kale:X", "trainer 'no_such_module_kale:X': cannot import no_such_module_kale (No module named "
                              "'no_such_module_kale'); install it in the worker's environment (the worker image on "
                              "Kubernetes)"),
    ("tests.runtime.trainers:make_payloads", "trainer 'tests.runtime.trainers:make_payloads' cannot be made without "
                                             "arguments (make_payloads() missing 2 required positional arguments: "
                                             "'n' and 'seed'); name a Trainer, or a class or function that makes one "
                                             "without arguments"),
    (f"{HERE}:HALF", f"trainer '{HERE}:HALF' is not a Trainer: it lacks padding, train_step, state_dict, "
                     "load_state_dict (kale_airflow.runtime.trainer.Trainer)"),
], ids=["module", "needs-arguments", "half"])
def test_a_refused_trainer_is_told_exactly_what_to_do(spec, message):
    with pytest.raises(TrainerError) as err:
        load_trainer(spec)
    assert str(err.value) == message


def test_a_state_that_uses_the_runtimes_keys_is_told_which():
    with pytest.raises(TrainerError) as err:
        check_state_keys({"model": {}, "steps": 1, "slices": []})
    assert str(err.value) == ("the trainer's state_dict uses slices, steps, which the runtime keeps in every checkpoint "
                              f"itself ({', '.join(sorted(RUNTIME_KEYS))}): rename them")


def test_a_torch_trainer_builds_on_the_device_asked_and_keeps_what_it_made():
    class Recorded(JSONRegression):
        def make(self, device, amp):
            self.made_with = (device, amp)
            return super().make(device, amp)

    cpu = torch.device("cpu")
    t = Recorded()
    module, optimizer = t.build(cpu, True)
    assert t.made_with == (cpu, True) and t.device == cpu and (t.module, t.optimizer) == (module, optimizer)
    r = Recorded()
    r.build(cpu)
    assert r.made_with == (cpu, False)  # amp is not asked for by default
