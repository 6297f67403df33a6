"""Finished one-off studies: each answered one question, recorded in benchmarks/results/ and docs/.

They stay runnable exactly as their results print them, through ``benchmarks/study.py``
(``python benchmarks/study.py NAME [OPTIONS]``), which puts ``benchmarks/`` on the import path
the way a script of that folder has it, so a study imports the shared ``_common`` helpers by
plain name. Each module defines one click command, ``main``.
"""
