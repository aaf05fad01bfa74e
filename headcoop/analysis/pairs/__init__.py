"""The pair map: every pair of heads' interaction on one metric under one ablation, exact on the coalition
game's layered path where the time budget allows it, else ranked by a stated screen whose top is computed
exactly and whose misses are bounded; the pairs that matter are then named by `hc.cooperation`'s reading
family. It may import the engine, the games and the mechanisms packages (it reads them; they never read it).
"""
