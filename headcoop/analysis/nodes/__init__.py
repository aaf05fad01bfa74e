"""Node-level analyses: activation patching, gradient attribution (AtP/AtP*/IG), probe patching, direct logit
attribution, probes, attention views, attention interventions. Built on the engine."""
