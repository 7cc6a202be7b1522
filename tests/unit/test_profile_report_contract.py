"""The ProfileReport's contract (contracts/profile_report.py): the reports made from the recorded H200 ncu export
and SASS decode and encode back to the same wire dict; a report that breaks the contract is refused with every key
named, and a reader that receives one keeps what it can read and says the rest."""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil

import pytest

from kernel_lsp.contracts.codec import ContractError, decode, encode
from kernel_lsp.contracts.profile_report import (
    EnergyReading,
    ProfileIsolation,
    ProfileMeasurements,
    ProfileReport,
    ReferenceKernel,
)
from kernel_lsp.kinds.profile import ProfileOutcome
from kernel_lsp.profile.report import imported_report, launch_profile, profile_report, received_report
from kernel_lsp.worker.protocol import Result
from profilers.ncu import parse_details_csv
from profilers.sass import parse_sass_stats
from tests.paths import FIXTURES

pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"needs the recorded fixtures at {FIXTURES}")


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def with_sass() -> ProfileReport:
    """The export's launches with their kernels' SASS (as a GPU run profiles an extension), as one ncu report of a
    GPU run: its energies, isolation and reference kernels."""
    sass = {stats.base_name: stats for stats in parse_sass_stats(fixture("cuobjdump_sass.txt"))}
    reading = EnergyReading(mj_per_call=41.5, calls=120, seconds=2.0, average_power_w=250.0, how="NVML")
    kernels = [dataclasses.replace(launch_profile(launch, None, {}, sass.get(launch.base_name)),
                                   energy_mj_per_call=reading.mj_per_call)
               for launch in parse_details_csv(fixture("ncu_details.csv"))]
    report = profile_report("ncu", kernels, gpu="NVIDIA H200",
                            reference_kernels=[ReferenceKernel("void at::native::add_kernel", 0.01, 1)])
    return dataclasses.replace(report, energy=reading, reference_energy=None,
                               isolation=ProfileIsolation(files="isolated: landlock", network="isolated: seccomp",
                                                          processes="isolated: keeper", namespaces="isolated: bwrap",
                                                          ncu="not isolated: RmProfilingAdminOnly"))


REPORTS = {"import with the raw page": lambda: imported_report(fixture("ncu_details.csv"), fixture("ncu_raw.csv")),
           "import of the details alone": lambda: imported_report(fixture("ncu_details.csv")),
           "a GPU run with SASS": with_sass}


@pytest.mark.parametrize("name", list(REPORTS))
def test_a_recorded_report_decodes_and_encodes_back_to_the_same_wire_dict(name: str):
    report = REPORTS[name]()
    wire = json.loads(json.dumps(encode(report)))  # as msgpack and JSON carry it
    assert decode(ProfileReport, wire) == report
    assert encode(decode(ProfileReport, wire)) == wire
    assert json.dumps(encode(decode(ProfileReport, wire))) == json.dumps(wire)  # the CLI's JSON, key order too


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
async def test_a_static_report_of_the_recorded_kernels_decodes_and_encodes_back():
    from kernel_lsp.profile.static import static_profile

    path = FIXTURES / "kernels.cu"
    report = await static_profile({"kernels.cu": path.read_text()}, "kernels.cu", {"kernels.cu": str(path)})
    wire = json.loads(json.dumps(encode(report)))
    assert decode(ProfileReport, wire) == report and encode(decode(ProfileReport, wire)) == wire
    kernel = wire["kernels"][0]
    assert kernel["metrics"]["ptxas"]["arch"] == "sm_90" and {"arch", "file", "line"} <= set(kernel)
    assert not {"duration_ms", "point", "occupancy_pct", "grid", "block", "energy_mj_per_call"} & set(kernel)


def test_what_a_source_does_not_give_is_absent_and_a_gpu_runs_figures_come_together():
    imported = encode(imported_report(fixture("ncu_details.csv")))
    assert not {"energy", "isolation", "reference_energy"} & set(imported)  # no GPU run
    kernel = imported["kernels"][0]
    assert {"duration_ms", "point", "occupancy_pct", "grid", "block"} <= set(kernel)
    assert not {"arch", "file", "line", "sass", "energy_mj_per_call"} & set(kernel)
    assert all("file" not in hint and "line" not in hint for hint in kernel["findings"])  # no place in a file
    run = encode(with_sass())
    assert run["reference_energy"] is None and run["energy"]["average_power_w"] == 250.0  # null: read, not there
    assert run["kernels"][0]["energy_mj_per_call"] == 41.5 and "sass" in run["kernels"][0]


def test_every_key_that_breaks_the_contract_is_named():
    wire = encode(with_sass())
    wire["surprise"] = 1  # unknown
    wire["source"] = "gpu"  # not a source
    kernel = wire["kernels"][0]
    kernel["id"] = "3"  # no int
    kernel["grid"] = [1, 2]  # not three
    kernel["bound"] = "fast"
    kernel["findings"][0]["severity"] = "error"  # hints are never errors
    kernel["findings"][1]["flag"] = True  # unknown
    kernel["metrics"]["GPU Speed Of Light Throughput"]["Duration"]["value"] = True  # no number
    del kernel["metrics"]["GPU Speed Of Light Throughput"]["Elapsed Cycles"]["unit"]  # missing
    kernel["sass"]["global_loads"] = {"32": "many"}
    del wire["kernels"][1]["name"]
    wire["energy"]["calls"] = 1.5  # no int
    wire["reference_kernels"][0]["device_ms"] = "fast"
    wire["problems"] = [{"code": "profile-no-sass"}]
    with pytest.raises(ContractError) as caught:
        decode(ProfileReport, wire)
    message = str(caught.value)
    for named in ("report: unknown key(s) ['surprise']", ".source:", ".kernels[0].id: expected int",
                  ".kernels[0].grid: expected 3 items", ".kernels[0].bound:", ".kernels[0].findings[0].severity:",
                  ".kernels[0].findings[1]: unknown key(s) ['flag']",
                  ".kernels[0].metrics['GPU Speed Of Light Throughput']['Duration'].value: expected a number",
                  ".kernels[0].metrics['GPU Speed Of Light Throughput']['Elapsed Cycles'].unit: missing",
                  ".kernels[0].sass.global_loads['32']: expected int", ".kernels[1].name: missing",
                  ".energy.calls: expected int", ".reference_kernels[0].device_ms: expected a number",
                  ".problems[0].message: missing"):
        assert named in message, (named, message)


def test_a_static_kernels_ptxas_figures_are_checked_like_the_rest():
    wire = {"source": "static", "gpu": None, "ceilings": None, "reference_kernels": [], "problems": [],
            "kernels": [{"kernel": "k", "name": "k()", "id": 0, "bound": None, "findings": [], "registers": 40,
                         "metrics": {"ptxas": {"arch": "sm_90", "registers": "40", "stack_frame": 0,
                                               "spill_stores": 0, "spill_loads": 0, "shared_bytes": 0}},
                         "arch": "sm_90", "file": "k.cu", "line": None}]}
    with pytest.raises(ContractError) as caught:
        decode(ProfileReport, wire)
    message = str(caught.value)
    assert ".kernels[0].metrics.ptxas.registers: expected int" in message, message
    assert ".kernels[0].metrics.ptxas.barriers: missing" in message, message


def test_a_reader_keeps_what_it_can_read_of_a_report_in_another_form_and_says_the_rest():
    report = with_sass()
    wire = encode(report)
    wire["kernels"][1]["launch_seconds"] = 1.0  # a kernel of a newer worker: unknown here
    wire["energy"] = {"joules": 1.0}
    received = received_report(copy.deepcopy(wire))
    assert [k.kernel for k in received.kernels] == [k.kernel for i, k in enumerate(report.kernels) if i != 1]
    assert received.source == "ncu" and received.gpu == "NVIDIA H200" and received.energy is None
    assert received.isolation == report.isolation and received.reference_kernels == report.reference_kernels
    broken = received.problems[-1]
    assert broken.code == "profile-contract" and "kernels[1]: unknown key(s) ['launch_seconds']" in broken.message
    assert ".energy.mj_per_call: missing" in broken.message
    for nothing in (None, [], "ncu"):  # not even a mapping: no kernels, and why
        said = received_report(nothing)
        assert said.kernels == [] and [p.code for p in said.problems] == ["profile-contract"]
    assert received_report(encode(report)) == report  # a report that keeps the contract: as sent, no problem


def test_a_client_reads_the_report_of_a_result_once_and_says_what_it_could_not():
    wire = encode(with_sass())
    outcome = ProfileOutcome.of(Result("ok", [], {"profile": wire, "summary": "7 kernels"}))
    assert outcome.report == with_sass() and outcome.summary == "7 kernels"
    wire["kernels"] = [{"kernel": "k"}]
    outcome = ProfileOutcome.of(Result("ok", [], {"profile": wire}))
    assert outcome.report.kernels == [] and outcome.report.problems[-1].code == "profile-contract"
    assert outcome.summary.startswith("no kernel profiled: the worker sent a report this client does not read")


def test_the_measuring_childs_answer_is_typed_too():
    measured = {"extensions": [], "reference_kernels": [{"name": "k", "device_ms": 0.5, "calls": 2}],
                "energy": {"mj_per_call": 1.5, "calls": 10, "seconds": 1.0, "how": "NVML"}, "reference_energy": None,
                "ceilings": None, "gpu_state": {"name": "NVIDIA H200", "clockEventReasons": ["sw_power_cap"]},
                "problems": [{"code": "profile-no-ceilings", "message": "m"}],
                "isolation": {"files": "isolated", "network": "isolated", "processes": "isolated",
                              "namespaces": "isolated"}}
    decoded = decode(ProfileMeasurements, measured)
    assert decoded.gpu_state["clockEventReasons"] == ["sw_power_cap"] and encode(decoded) == measured
    with pytest.raises(ContractError, match=r"\.reference_kernels\[0\]\.calls: expected int"):
        decode(ProfileMeasurements, {**measured, "reference_kernels": [{"name": "k", "device_ms": 0.5, "calls": "2"}]})
