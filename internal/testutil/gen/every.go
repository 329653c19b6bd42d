package gen

import (
	"fmt"
	"reflect"
)

// Every returns a T with every exported field set, none to its zero and no two numbers alike: a
// string to the field's name, a number to its place in T (1, 2, … counting the fields of embedded
// and nested structs), a bool to true. A test that a struct is carried whole fills it so. It
// panics on a field of another kind (a pointer, a slice, a map), which the test sets itself.
func Every[T any]() T {
	var v T
	n := 0
	every(reflect.ValueOf(&v).Elem(), &n)
	return v
}

func every(v reflect.Value, n *int) {
	for i := range v.NumField() {
		f, name := v.Field(i), v.Type().Field(i).Name
		if !f.CanSet() {
			continue
		}
		if f.Kind() == reflect.Struct {
			every(f, n)
			continue
		}
		*n++
		switch f.Kind() {
		case reflect.String:
			f.SetString(name)
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			f.SetInt(int64(*n))
		case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			f.SetUint(uint64(*n))
		case reflect.Float32, reflect.Float64:
			f.SetFloat(float64(*n))
		case reflect.Bool:
			f.SetBool(true)
		default:
			panic(fmt.Sprintf("gen.Every: %s.%s is a %s", v.Type(), name, f.Kind()))
		}
	}
}
