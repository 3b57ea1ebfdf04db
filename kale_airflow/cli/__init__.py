"""The ``kale`` command (:mod:`.main`) and ``kale demo`` (:mod:`.demo`). Entry points only: nothing imports this package."""
