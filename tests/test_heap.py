"""The loaded pair sits outside the cyclic collector's full scans (`models.freeze_heap`): without that, a full
collection scanned ~460k objects (~190 ms) in the middle of some round."""
import gc
import weakref

from treegraft.models import freeze_heap


def tracked(obj) -> bool:
    return any(o is obj for o in gc.get_objects())


def test_a_loaded_pair_is_frozen_out_of_full_collections(fp32_pair):
    assert gc.get_freeze_count() > 100_000  # the libraries and the models, not a handful
    for part in (fp32_pair.target, fp32_pair.target.model.layers[0], fp32_pair.mid):
        assert not tracked(part)
    fresh = [[]]  # what generation makes afterwards is still scanned
    assert tracked(fresh)


def test_cyclic_garbage_frozen_by_one_load_is_collected_at_the_next():
    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: reference counts alone never free it
    gone = weakref.ref(a)
    freeze_heap()
    del a, b
    gc.collect()
    assert gone() is not None  # frozen: the collector does not look at it
    freeze_heap()
    assert gone() is None
