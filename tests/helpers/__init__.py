"""What the test modules share: reference implementations, hypothesis strategies, synthetic logs, stand-ins for the
frameworks' trainers, the README's blocks, the plugin installer and the workers that ``torchrun`` starts. Test
modules import from here (or take a fixture from a ``conftest.py``), never from one another."""
