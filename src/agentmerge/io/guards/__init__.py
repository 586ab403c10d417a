"""What keeps hostile input out and broken output from being written: bounded reads, strict JSON in
and out, time-limited user patterns, which paths are inputs and outputs, finiteness checks. Imports no
other part of ``io``.
"""
