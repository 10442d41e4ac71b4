"""Write tfds dataset metadata for the examples' datasets, offline: ``python tfds_meta.py OUT_DIR``.

Upstream CI checked out tensorflow_datasets' ``testing/metadata`` (dataset_info.json and
features.json per dataset version) for ``tfds.testing.mock_data(data_dir=...)``. This writes the
same files from the stack's own dataset builders (their features, this version) with the split
sizes of the published datasets, without downloading anything: the builders are created with
GCS access disabled and nothing is prepared.
"""
import os
import sys

#: dataset -> {split: number of examples in the published dataset}
DATASETS = {
    'mnist': {'train': 60000, 'test': 10000},
    'cifar10': {'train': 50000, 'test': 10000},
    'imagenet2012:5.*.*': {'train': 1281167, 'validation': 50000},
    'wmt17_translate/de-en': {'train': 5906184, 'validation': 2999, 'test': 3004},
    'wmt14_translate/de-en': {'train': 4508785, 'validation': 3000, 'test': 3003},
    'binarized_mnist': {'train': 50000, 'validation': 10000, 'test': 10000},
}


def write(out_dir: str) -> list[str]:
  import tensorflow_datasets as tfds
  from tensorflow_datasets.core.utils import gcs_utils
  gcs_utils._is_gcs_disabled = True  # pylint: disable=protected-access
  written = []
  small = os.environ.get('EXAMPLES_TFDS_SPLIT_SIZE')  # e.g. 1: epoch ends (and evals) come at once
  for name, splits in DATASETS.items():
    if small:
      splits = {s: int(small) for s in splits}
    builder = tfds.builder(name, data_dir=out_dir)
    infos = []
    for split, n in splits.items():
      kwargs = dict(name=split, shard_lengths=[n], num_bytes=0)
      try:
        template = tfds.core.ShardedFileTemplate(
            data_dir=builder.data_dir, dataset_name=builder.name, split=split,
            filetype_suffix='tfrecord')
        infos.append(tfds.core.SplitInfo(filename_template=template, **kwargs))
      except (AttributeError, TypeError):
        infos.append(tfds.core.SplitInfo(**kwargs))
    try:
      split_dict = tfds.core.SplitDict(infos)
    except TypeError:
      split_dict = tfds.core.SplitDict(infos, dataset_name=builder.name)
    builder.info.set_splits(split_dict)
    os.makedirs(builder.data_dir, exist_ok=True)
    builder.info.write_to_directory(builder.data_dir)
    written.append(str(builder.data_dir))
  return written


if __name__ == '__main__':
  if len(sys.argv) != 2:
    sys.exit('usage: tfds_meta.py OUT_DIR')
  for d in write(sys.argv[1]):
    print(d)
