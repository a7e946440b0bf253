"""The steps of a job, each JSON in and JSON out so a process pool or a Lambda can run it:
plan → scan → cut → write → stage → validate → publish, and the canary and abort around them.
"""
