"""Framework integrations: one module (or package) per framework, each a plug-in of treepack's
generic layer (docs/architecture.md, "The Python packages: integrations as plug-ins").

The generic layer (``treepack._api``, ``_codec``, ``_like``, ``_lazy``, ...) never imports these
modules: ``treepack._registry.INTEGRATIONS`` names, for each, the frameworks, node types,
annotation types, ``load()`` options and services that lead to it, and it is imported the first
time one of them is met (so ``import treepack`` imports none of them, and none of their
frameworks). When imported, a module registers its functions with
``treepack._plugin.integrate(__name__, ...)``. Integrations use treepack only through
``treepack._plugin``, the extension API (tests/test_architecture.py checks both rules).
"""
