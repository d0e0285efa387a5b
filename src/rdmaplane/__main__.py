from rdmaplane.cli import main

main()
