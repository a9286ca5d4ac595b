"""The data a :class:`~mimo_pipes.config.PipelineConfig` names: the dataset's and the processor's paths (the
embedded ones when none is given), the folder the data's image paths resolve inside, and the processor every
rank uses, checked against the time model. Recipes and ``mimo-pipes check`` open the data through these."""

from __future__ import annotations

from typing import Any

from mimo_pipes.config import PipelineConfig, flag
from mimo_pipes.data.embedded.builtin_dataset import default_dataset_path
from mimo_pipes.data.embedded.builtin_processor import default_processor_path
from mimo_pipes.data.processing.processor import SampleProcessor, load_processor
from mimo_pipes.data.sources.open_source import dataset_folder
from mimo_pipes.data.storage.s3_url import is_s3
from mimo_pipes.errors import ConfigError
from mimo_pipes.time_model import TimeModelError


def dataset_path(config: PipelineConfig) -> str:
    return config.dataset or str(default_dataset_path(config.embedded_samples, seed=0))


def processor_path(config: PipelineConfig) -> str:
    return config.processor or str(default_processor_path())


def image_folder(config: PipelineConfig) -> str:
    """Where the data's image and video paths resolve (and must stay): ``--image-folder``, else the
    dataset's own folder."""
    return config.image_folder or str(dataset_folder(dataset_path(config)))


def open_processor(config: PipelineConfig) -> SampleProcessor:
    """The processor every rank uses, checked against the time model (``--reorder-cost-model``)."""
    processor = load_processor(processor_path(config), config.seq_length, image_folder=image_folder(config))
    check_time_model(config, processor)
    return processor


def check_time_model(config: PipelineConfig, processor: Any) -> None:
    """A time model fit for other patches than the processor makes is refused."""
    model = config.reorder.load_time_model()
    if model is None:
        return
    try:
        model.check_geometry(
            config.reorder.reorder_cost_model,
            merge_size=processor.merge_size,
            patch_size=processor.patch_size,
            temporal_patch_size=processor.temporal_patch_size,
        )
    except TimeModelError as error:
        raise ConfigError(flag("reorder_cost_model"), str(error)) from None


def check_data_settings(config: PipelineConfig) -> None:
    """What the config's data settings must be beside its source, checked before any rank starts (after
    ``config.validate()``): --split-part names a split of an Energon source; --image-folder does not apply to one."""
    from mimo_pipes.data.sources.energon_source import check_split, is_energon

    if not isinstance(config.split_part, str) or not config.split_part.strip():
        raise ConfigError(flag("split_part"), f"must name a split part (train, val, test), got {config.split_part!r}")
    check_split(config.dataset, config.split_part)
    if is_s3(config.image_folder):
        from mimo_pipes.data.sources.s3_source import check_s3_folder

        check_s3_folder(str(config.image_folder), flag("image_folder"))
    if config.image_folder is not None and config.dataset is not None and is_energon(config.dataset):
        raise ConfigError(flag("image_folder"), f"does not apply to an Energon --dataset ({config.dataset}): its images are read "
                                                "from its shards; leave --image-folder out")
