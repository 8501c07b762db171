"""The project directory holding a training run config, as stacks name it."""

import pytest
import yaml


@pytest.fixture
def project(tmp_path):
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({
        "run": {"name": "gpt-small"}, "data": {"path": "s3://spotray-dev/spotray/data"},
        "checkpoint": {"path": "s3://spotray-dev/spotray/ckpt"}, "scaling": {"num_workers": 2, "use_gpu": True}}))
    return tmp_path
