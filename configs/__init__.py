"""The jobs streamrl ships: YAML configs, installed as package data of ``streamrl.configs``.

``streamrl launch`` without a config runs ``default.yaml`` from here, whatever the working
directory; a shipped job can also be named (``streamrl launch tiny``). See ``configs/*.yaml``.
"""
