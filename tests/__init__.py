"""onnxmt's tests, laid out as src/onnxmt is: tests/runtime/ tests onnxmt/runtime/, tests/serve/ onnxmt/serve/, and
so on; a module's tests are in test_<module>.py (test_<module>_<aspect>.py where one module has several files), the
top-level modules' beside this file.

A package, as starlette's tests are: test modules import shared code as `from tests.helpers.server import ...`
(pytest puts the repository root on sys.path; `python -m pytest` from the root does too). Fixtures live in the
conftest.py of the folder whose tests use them; nothing imports a test module.
"""
