"""One loader for `dynsched run` and `simulate`: each mistake is one line naming file and key."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from policies.check import load_checked_config
from services.cli import main
from shared.config import config_json_schema, config_to_dict, load_config
from sim.scenario import Scenario

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted([*(ROOT / "configs").glob("*.yaml"), *(ROOT / "scenarios").rglob("*.yaml")])
SMALL = ROOT / "configs" / "sim_small.yaml"


def small_config_with(section: str, key: str, value: object) -> dict:
    data = yaml.safe_load(SMALL.read_text())
    data.setdefault(section, {})[key] = value
    return data


MISTAKES = [  # (id, file text or a change to sim_small, what the line must say)
    ("yaml_syntax", "run:\n  name: [unclosed\ndata: {}\n", r"cfg\.yaml:\d+:\d+: YAML syntax error: "),
    ("wrong_type", ("trainer", "num_gpus", "many"), r"trainer\.num_gpus='many' is invalid: expected int"),
    ("inf", ("async_training", "staleness_threshold", float("inf")),
     r"async_training\.staleness_threshold=inf is invalid: expected a finite number"),
    ("nan", ("run", "time_scale", float("nan")), r"run\.time_scale=nan is invalid: expected a finite number"),
    ("inf_time_scale", ("run", "time_scale", float("inf")),  # written as YAML's `.inf`
     r"run\.time_scale=inf is invalid: expected a finite number"),
    ("negative_duration", ("trainer", "offload_s", -1.0),
     r"trainer\.offload_s=-1\.0 is invalid: expected >= 0"),
    ("small_event_cap", ("run", "event_stream_maxlen", 10),
     r"run\.event_stream_maxlen=10 is invalid: expected >= 1000"),
    ("zero_hung_grace", ("run", "hung_grace_s", 0.0), r"run\.hung_grace_s=0\.0 is invalid: expected > 0"),
    ("zero_hybrid_concurrency", ("async_training", "hybrid_concurrent_samples_per_replica", 0),
     r"async_training\.hybrid_concurrent_samples_per_replica=0 is invalid: expected >= 1"),
    ("unknown_key", ("trainer", "bogus", 1), r"unknown key trainer\.bogus; known under trainer: backend, "),
    ("bad_namespace", ("run", "namespace", "*"),
     r"run\.namespace='\*' is invalid: expected letters, digits, '_', '\.' or '-' only"),
    ("unknown_policy", ("async_training", "dynamic_schedule_policy", "bogus"),
     r"async_training\.dynamic_schedule_policy='bogus' is invalid: expected a registered policy "
     r"\(adaptive, default, "),
    ("bad_policy_module", ("async_training", "dynamic_schedule_policy_module", "no_such_policy_pkg"),
     r"async_training\.dynamic_schedule_policy_module='no_such_policy_pkg' is invalid: cannot import it "
     r"\(ModuleNotFoundError: "),
]


def write_mistake(tmp_path: Path, mistake: object) -> Path:
    path = tmp_path / "cfg.yaml"
    if isinstance(mistake, str):
        path.write_text(mistake)
    else:
        assert isinstance(mistake, tuple)
        path.write_text(yaml.safe_dump(small_config_with(*mistake)))
    return path


@pytest.mark.parametrize("command", ["config-check", "simulate", "run"])
@pytest.mark.parametrize(("mistake", "complaint"), [m[1:] for m in MISTAKES], ids=[m[0] for m in MISTAKES])
def test_each_config_mistake_is_one_line_naming_the_file_and_the_key(tmp_path, capsys, command, mistake,
                                                                     complaint):
    path = write_mistake(tmp_path, mistake)
    argv = {"config-check": ["config-check", str(path)], "simulate": ["simulate", "--config", str(path)],
            "run": ["run", "--config", str(path), "--out", str(tmp_path / "out")]}[command]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"dynsched: error: config: {path}"), err
    assert re.search(complaint, err), err
    assert not (tmp_path / "out").exists()  # `run` stopped before starting anything


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_config_and_scenario_loads_with_its_policy(path):
    config = load_checked_config(path)
    scenario = Scenario.from_config(config)
    assert scenario.cluster.total_gpus == config.trainer.num_gpus + config.rollout.num_standalone_gpus


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("sim_*.yaml")), ids=lambda p: p.name)
def test_simulate_runs_on_every_shipped_sim_config(path, capsys):
    assert main(["simulate", "--config", str(path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    samples = result["samples"]
    accounted = samples["generating"] + samples["queued"] + samples["trained"] + samples["dropped"]
    assert samples["fed"] == accounted
    assert samples["trained"] == load_config(path).data.total_rollout_steps


def test_a_config_round_trips_through_plain_data_and_yaml(tmp_path):
    config = load_config(ROOT / "scenarios" / "seed_qwen35_35b_a3b_32xh20.yaml")
    path = tmp_path / "copy.yaml"
    path.write_text(yaml.safe_dump(config_to_dict(config)))
    assert load_config(path) == config


def test_the_simulator_uses_the_services_names_and_defaults():
    config = load_config(SMALL)
    scenario = Scenario.from_config(config)
    assert scenario.replica.retry_delay_s == config.rollout.retry_delay_s
    assert scenario.replica.decode_step_s == config.rollout.sim.decode_s_per_step
    assert scenario.replica.max_running_requests == config.rollout.max_num_seqs
    assert scenario.costs.monitor_interval_s == pytest.approx(0.1 / config.run.time_scale)
    assert scenario.costs.hybrid_sync_s == pytest.approx(
        config.trainer.offload_s + config.rollout.sim.wake_s + config.rollout.sim.weight_sync_s)
    static = scenario.with_changes({"async_training.use_dynamic_resource_scheduling": False})
    # as the controller service builds it:
    assert static.async_training.dynamic_schedule_policy == "static_fully_async"
    assert scenario.workload.kind == "normal"  # no simulator.workload: the sim engine's response lengths


def test_the_shipped_json_schema_is_current_and_config_schema_prints_it(capsys):
    shipped = json.loads((ROOT / "configs" / "config.schema.json").read_text())
    assert shipped == config_json_schema(), "regenerate: dynsched config-schema > configs/config.schema.json"
    assert main(["config-schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert set(printed["properties"]) == {"run", "data", "trainer", "async_training", "rollout", "simulator"}
    assert printed["additionalProperties"] is False
