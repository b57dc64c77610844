"""The demo: the example ML pipeline under the controller on the local spot cloud
(``spot-pipelines demo``). Engine-agnostic; the engines' demos live in their packages."""
