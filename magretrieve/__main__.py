from magretrieve.cli import main

main()
