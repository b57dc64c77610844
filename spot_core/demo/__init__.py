"""The demo: the example ML pipeline under the controller on the local spot cloud
(``spot-pipelines demo``), or on the spot node pools of the Kubernetes emulator
(``--provider kubernetes``). Engine-agnostic; the engines' demos live in their packages."""

# Where a demo's training step runs, named after the provider it runs on: the local spot
# cloud replaying a real trace (the default), or the Kubernetes emulator's node pools.
LOCAL_CLOUD = "local"
EMULATED_KUBERNETES = "kubernetes"
DEMO_PROVIDERS = (LOCAL_CLOUD, EMULATED_KUBERNETES)
