"""llm42's pytest plugin: the gpu marker, the --llm42-* options and the generator factory fixture.

Each test runs a small pytest session in-process (``pytester``) on a test file
written on the fly; the plugin is loaded there through its entry point, as in
a user's project.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from llm42.model import embedded_model_path

pytest_plugins = ["pytester"]



def test_factory_builds_fresh_generators_over_the_embedded_model(pytester):
    pytester.makepyfile(
        """
        from llm42 import SamplingParams

        def test_factory(llm42_generator_factory, llm42_checkpoint, llm42_device):
            assert llm42_checkpoint is None and llm42_device == "cpu"
            a = llm42_generator_factory(window=4, group=2)
            b = llm42_generator_factory(window=4, group=2)
            assert a is not b and a.kv is not b.kv
            assert a.canonical_config.num_rows == 8
            assert a.tokenizer is not None and a.tokenizer is b.tokenizer  # loaded once per session
            params = SamplingParams(max_new_tokens=4, deterministic=True)
            assert a.generate(["Once upon a time"], params)[0].token_ids == \\
                b.generate(["Once upon a time"], params)[0].token_ids
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_checkpoint_and_device_options_reach_the_factory(pytester, tmp_path):
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(embedded_model_path() / name, checkpoint / name)
    pytester.makepyfile(
        f"""
        from pathlib import Path

        def test_options(llm42_generator_factory, llm42_checkpoint, llm42_device):
            assert llm42_checkpoint == Path({str(checkpoint)!r}) and llm42_device == "cpu"
            gen = llm42_generator_factory(group=1)
            assert gen.tokenizer is None and gen.canonical_config.group == 1
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", f"--llm42-checkpoint={checkpoint}", "--llm42-device=cpu")
    result.assert_outcomes(passed=1)


def test_a_bad_checkpoint_fails_the_test_with_the_loader_error(pytester, tmp_path):
    pytester.makepyfile(
        """
        def test_uses_it(llm42_generator_factory):
            llm42_generator_factory()
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", f"--llm42-checkpoint={tmp_path / 'missing'}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*CheckpointError*does not exist*"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks skipping without CUDA")
def test_gpu_marker_is_registered_and_skips_without_cuda(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.gpu
        def test_on_gpu():
            raise AssertionError("must not run without CUDA")

        def test_on_cpu():
            pass
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--strict-markers")
    result.assert_outcomes(passed=1, skipped=1)

    pytester.makepyfile(test_cuda_device="def test_x(llm42_device):\n    raise AssertionError('ran')\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--llm42-device=cuda", "test_cuda_device.py")
    result.assert_outcomes(skipped=1)
