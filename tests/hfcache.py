"""A Hugging Face *datasets* cache populated the way ``datasets.load_dataset`` leaves it after a download.

``datasets`` itself prepares the Arrow files (its Parquet builder, from Parquet files of the rows), under
``<cache>/<owner>___<name>/<config>/0.0.0/<hash>/``: the layout its offline mode (``HF_DATASETS_OFFLINE=1``)
reads back by dataset id.  Nothing is mocked: the code under test calls the real ``load_dataset``.
"""

from __future__ import annotations

import shutil
from pathlib import Path


def put_in_datasets_cache(cache: Path, repo_id: str, config: str, splits: dict) -> Path:
    """Cache ``splits`` (split name → ``datasets.Dataset``) as dataset ``repo_id`` with config ``config``."""
    from datasets.data_files import DataFilesDict
    from datasets.packaged_modules.parquet.parquet import Parquet

    files = cache / "_source" / repo_id / config
    files.mkdir(parents=True, exist_ok=True)
    for split, ds in splits.items():
        ds.to_parquet(str(files / f"{split}-00000-of-00001.parquet"))
    patterns = {split: [f"{split}-*"] for split in splits}
    name = repo_id.split("/")[-1]
    builder = Parquet(
        cache_dir=str(cache),
        dataset_name=name,
        config_name=config,
        data_files=DataFilesDict.from_patterns(patterns, base_path=str(files)),
        features=next(iter(splits.values())).features,
        hash="0" * 16,
    )
    builder.download_and_prepare()
    built = Path(builder.cache_dir)  # <cache>/<name>/<config>-<data files hash>/0.0.0/<hash>
    target = cache / repo_id.replace("/", "___") / config
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(built.parent.parent), str(target))  # named by id and config, as a Hub download is
    if (cache / name) != target.parent and (cache / name).is_dir():
        shutil.rmtree(cache / name)
    return target
