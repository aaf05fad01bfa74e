"""The numbers of hc.faithfulness and hc.edges that cannot be read say why (issue 51)."""

import headcoop as hc


def test_numbers_that_cannot_be_read_say_so():
    """Issue 51: one circuit's CPR and CMD are NaN, with the reason in the repr; an estimate no edge of which
    was patched exactly says it is unverified; a miss bound that allows more misses than the verified top
    says it bounds little."""
    model = hc.load("count01")
    edges = hc.edges(model, progress=False)
    assert "unverified: no edge patched exactly" in repr(edges)
    one = hc.faithfulness(model, hc.circuit(edges, k=5), progress=False)
    assert "NaN: one circuit has no curve" in repr(one)
    wide = hc.edges(model, progress=False, verify=3, sample=2)
    assert "verified: 3 top and 2 sampled" in repr(wide) and "bounds little" in repr(wide)
    assert "bounds little" not in repr(hc.edges(model, progress=False, verify=20, sample=90))
