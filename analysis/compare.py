"""What distinguishes several results files of one job: the resolved-configuration keys
(root attribute ``config``) whose values differ between them."""

# Keys that never change what a run measures: where its outputs go (results, trace, metrics
# stream, weights, checkpoints). They differ between any two runs of a study without describing it.
IGNORED = {"run.output", "run.trace", "run.metrics", "train.save", "train.checkpoint_path", "train.checkpoint_dir",
           "prune.output"}


def differing_keys(results):
    """Sorted "section.key" names whose values are not the same in all of `results`."""
    keys = set()
    for r in results:
        keys |= set(r.config)
    return sorted(k for k in keys - IGNORED if len({r.config.get(k, "") for r in results}) > 1)


def label(result, keys):
    """Short legend label: the differing keys' values, else the file name."""
    if not keys:
        return result.name
    return ", ".join(f"{k.split('.', 1)[1]}={result.config.get(k, '')}" for k in keys)


def key_cells(result, keys):
    return [result.config.get(k, "") for k in keys]


def _sort_value(text):
    try:
        return (0, float(text), "")
    except ValueError:
        return (1, 0.0, text)


def sorted_by_keys(results, keys):
    """Results ordered by their differing keys' values, numbers numerically (16 < 128)."""
    return sorted(results, key=lambda r: [_sort_value(r.config.get(k, "")) for k in keys])
