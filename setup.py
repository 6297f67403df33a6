"""Package discovery only; all metadata lives in pyproject.toml.

The design keeps two top-level folders that install inside the package: ``adapters/`` as
``magretrieve.adapters`` and ``export/`` as ``magretrieve.export``. pyproject's ``packages.find``
cannot discover packages under a remapped folder, so the list is computed here, from the tree,
and can never drift from it.
"""

from setuptools import find_packages, setup

MAPPED = {"magretrieve.adapters": "adapters", "magretrieve.export": "export"}

packages = find_packages(include=["magretrieve", "magretrieve.*"])
package_dir = {"magretrieve": "magretrieve"}
for name, folder in MAPPED.items():
    packages.append(name)
    package_dir[name] = folder
    for sub in find_packages(where=folder):
        packages.append(f"{name}.{sub}")
        package_dir[f"{name}.{sub}"] = f"{folder}/{sub.replace('.', '/')}"

# diagnose quotes measured figures from a file the benchmarks write (magretrieve.diagnose.evidence)
setup(
    packages=packages,
    package_dir=package_dir,
    package_data={"magretrieve.diagnose": ["evidence.json"]},
)
