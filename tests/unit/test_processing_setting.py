"""Where a rank's per-sample processing runs (mimo_pipes/config/processing.py): the ``processing`` setting,
``auto``'s choice, and worker processes that import the program's main module only where they must."""

from __future__ import annotations

import logging
import pickle
import sys
import types

import pytest

from mimo_pipes.config import PipelineConfig
from mimo_pipes.config.processing import processing_method
from mimo_pipes.errors import ConfigError
from mimo_pipes.samples import worker_start

PLATFORM_FORKS = worker_start.forked_workers()


def processing_step(sample: dict) -> dict:
    """A per-sample step that pickles by reference (a function of an importable module)."""
    return sample


def test_the_setting_is_checked_where_it_is_made_naming_it():
    assert PipelineConfig().processing == "auto"
    for bad in ("fork", "threads", None, 2):
        with pytest.raises(ConfigError, match=r"^processing: must be one of auto, thread, process"):
            PipelineConfig(processing=bad)
    with pytest.raises(ConfigError, match=r"^processing: must be one of auto, thread, process, got 'spawn'$"):
        processing_method("spawn", 4)


def test_the_command_line_takes_the_setting_and_refuses_others(capsys):
    import argparse

    from mimo_pipes.cli.job.args import add_job_arguments, config_from_args

    parser = argparse.ArgumentParser(prog="mimo-pipes run")
    add_job_arguments(parser)
    assert config_from_args(parser.parse_args(["--processing", "thread"]))[0].processing == "thread"
    assert config_from_args(parser.parse_args([]))[0].processing == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["--processing", "fork"])
    assert "--processing: invalid choice: 'fork'" in capsys.readouterr().err


def test_thread_and_process_are_taken_as_set():
    assert processing_method("thread", 8, work=(processing_step,)) == "thread"
    assert processing_method("process", 1, work=(processing_step,)) == "process"
    assert processing_method("thread", 8, work=(lambda sample: sample,)) == "thread"


@pytest.mark.skipif(not PLATFORM_FORKS, reason="worker processes start from the library's server only on POSIX, Python 3.11-3.12")
def test_auto_takes_processes_with_two_workers_or_more_for_work_that_pickles(caplog):
    assert processing_method("auto", 2, work=(processing_step,)) == "process"
    assert processing_method("auto", 14, work=()) == "process"
    with caplog.at_level(logging.INFO, logger="mimo_pipes.config.processing"):
        assert processing_method("auto", 1, work=(processing_step,)) == "thread"
        unpicklable = lambda sample: sample  # noqa: E731 - a lambda does not pickle
        assert processing_method("auto", 4, work=(processing_step, unpicklable)) == "thread"
    warned = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert any("does not pickle" in record.getMessage() for record in warned), caplog.text


@pytest.fixture
def main_module(tmp_path, monkeypatch):
    """A stand-in for the program's main module: a script file of the test's text, with ``step`` defined in it."""

    def make(text: str) -> types.FunctionType:
        script = tmp_path / f"program_{len(list(tmp_path.iterdir()))}.py"
        script.write_text(text)
        module = types.ModuleType("__main__")
        module.__file__ = str(script)

        def step(sample: dict) -> dict:
            return sample

        step.__module__, step.__qualname__ = "__main__", "step"
        module.step = step
        monkeypatch.setitem(sys.modules, "__main__", module)
        return step

    return make


UNGUARDED = "import mimo_pipes\nloader = build()\nfor batch in loader:\n    pass\n"
GUARDED = "import mimo_pipes\n\ndef main():\n    pass\n\nif __name__ == '__main__':\n    main()\n"


def test_a_function_of_an_unguarded_main_module_is_refused_for_processes_naming_it(main_module):
    step = main_module(UNGUARDED)
    pickled = pickle.dumps(step)
    assert worker_start.refers_to_main(pickled) and worker_start.main_names(pickled) == ["step"]
    with pytest.raises(ConfigError, match=r"^processing: worker processes .* run step of .*program_0\.py, the program's main "
                                          r"module, .*if __name__ == \"__main__\""):
        processing_method("process", 4, work=(processing_step, step))


@pytest.mark.skipif(not PLATFORM_FORKS, reason="worker processes start from the library's server only on POSIX, Python 3.11-3.12")
def test_auto_keeps_an_unguarded_main_modules_function_on_threads_and_says_why(main_module, caplog):
    step = main_module(UNGUARDED)
    with caplog.at_level(logging.WARNING, logger="mimo_pipes.config.processing"):
        assert processing_method("auto", 4, work=(step,)) == "thread"
    assert "run step of" in caplog.text
    # The library's own processing names nothing of the main module: processes, guard or not.
    assert processing_method("auto", 4, work=(processing_step,)) == "process"


@pytest.mark.parametrize("guard", [
    "if __name__ == '__main__':\n    main()\n",
    'if "__main__" == __name__:\n    main()\n',
])
def test_a_guarded_main_modules_function_may_run_on_processes(main_module, guard):
    step = main_module("def main():\n    pass\n\n" + guard)
    assert worker_start.unguarded_main() is None
    assert processing_method("process", 4, work=(step,)) == "process"


def test_a_guard_inside_a_function_or_comparing_something_else_is_no_guard(main_module):
    main_module("def main():\n    if __name__ == '__main__':\n        pass\n")
    assert worker_start.unguarded_main() is not None
    main_module("if __name__ == 'program':\n    pass\n")
    assert worker_start.unguarded_main() is not None
    main_module(GUARDED)
    assert worker_start.unguarded_main() is None


def test_an_interactive_main_module_is_never_refused(monkeypatch):
    module = types.ModuleType("__main__")  # python -c, a notebook's kernel: no file to run again
    monkeypatch.setitem(sys.modules, "__main__", module)
    assert worker_start.unguarded_main() is None


def test_main_names_reads_every_protocol():
    step = types.FunctionType(processing_step.__code__, {}, "helper")
    step.__module__, step.__qualname__ = "__main__", "helper"
    module = types.ModuleType("__main__")
    module.helper = step
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = module
    try:
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            assert worker_start.main_names(pickle.dumps([step, 3], protocol=protocol)) == ["helper"], protocol
    finally:
        sys.modules["__main__"] = saved
    assert worker_start.main_names(pickle.dumps(processing_step)) == []
    assert not worker_start.refers_to_main(pickle.dumps(processing_step))


def _choices_in_a_daemon(results) -> None:
    """In a daemonic process: what auto and process give."""
    from mimo_pipes.config.processing import processing_method

    out = {"auto": processing_method("auto", 4, work=(processing_step,))}
    try:
        processing_method("process", 4, work=(processing_step,))
        out["process"] = "allowed"
    except ConfigError as error:
        out["process"] = str(error)
    results.put(out)


@pytest.mark.launch  # starts a process
def test_a_daemonic_process_processes_on_threads_and_refuses_processes_in_one_line():
    import multiprocessing

    context = worker_start.worker_context()
    results = context.Queue()
    daemon = context.Process(target=_choices_in_a_daemon, args=(results,), daemon=True)
    daemon.start()
    out = results.get(timeout=120)
    daemon.join(30)
    assert out["auto"] == "thread"
    assert out["process"].startswith("processing: this process (") and "is daemonic" in out["process"], out
    assert not multiprocessing.current_process().daemon  # here, the same check lets processes start
