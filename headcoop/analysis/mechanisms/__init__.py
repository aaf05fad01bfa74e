"""The mechanism words of hc.cooperation: the axes each word is read from, and the entry point."""
