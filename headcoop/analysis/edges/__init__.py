"""Edges of the residual graph: the graph, exact edge patching (hc.path_patch is its head-to-head view),
EAP / EAP-IG, circuits, faithfulness, MIB export."""
